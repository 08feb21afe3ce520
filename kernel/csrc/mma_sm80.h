// sm_80-level tensor-core and shared-memory primitives (mma.sync m16n8k16 with fp32
// accumulation, ldmatrix, the fp8 KV dequantization), shared by the verify kernel and
// bench/kdtree_bench/kernel/csrc/mma_ceiling.cu so that the ceiling is measured with the very
// instruction wrappers the kernel issues.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kdtree {

// D += A B for one m16n8k16 tile with fp32 accumulation; TYPE is the PTX type of A and B.
#define KDTREE_MMA_M16N8K16(TYPE, c, a, b0, b1)                               \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE         \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])               \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

// Element-type operations of the kernels: Elem is __nv_bfloat16 or __half.
template <typename Elem>
struct ElemOps {
  static constexpr bool kBF16 = std::is_same_v<Elem, __nv_bfloat16>;
  static_assert(kBF16 || std::is_same_v<Elem, __half>, "bf16 or fp16 only");

  // Two floats rounded to Elem, packed as one 32-bit MMA operand register.
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    const auto v = [&] {
      if constexpr (kBF16) return __floats2bfloat162_rn(a, b);
      else return __floats2half2_rn(a, b);
    }();
    uint32_t bits;
    memcpy(&bits, &v, sizeof(bits));
    return bits;
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    if constexpr (kBF16) KDTREE_MMA_M16N8K16("bf16", c, a, b0, b1);
    else KDTREE_MMA_M16N8K16("f16", c, a, b0, b1);
  }
};

#undef KDTREE_MMA_M16N8K16

// Four float8_e4m3fn values (the bytes of x, lowest first) as two packed Elem pairs, exactly:
// every finite e4m3 value (|x| <= 448, subnormals down to 2^-9) is representable in fp16 and in
// bf16. lo holds bytes 0 and 1, hi bytes 2 and 3.
// sm_89 and up (sm_90, sm_120) convert in hardware (cvt.rn.f16x2.e4m3x2; bf16 through fp32, which
// is exact). sm_80 has no fp8 conversion: the bits are placed by hand (sign, then exponent and
// mantissa shifted into Elem's fields) and one fma by a power of two fixes the exponent bias,
// which also turns e4m3 subnormals into the right values. The two NaN codes (0x7f, 0xff) come out
// as +-480 there instead of NaN.
template <typename Elem>
__device__ __forceinline__ void fp8x4_to_elem2x2(uint32_t x, uint32_t& lo, uint32_t& hi) {
  constexpr bool kBF16 = std::is_same_v<Elem, __nv_bfloat16>;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h01, h23;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(h01), "=r"(h23)
      : "r"(x));
  if constexpr (kBF16) {
    const auto to_bf16 = [](uint32_t h) {
      __half2 v;
      memcpy(&v, &h, sizeof(v));
      const float2 f = __half22float2(v);
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
      uint32_t bits;
      memcpy(&bits, &b, sizeof(bits));
      return bits;
    };
    lo = to_bf16(h01);
    hi = to_bf16(h23);
  } else {
    lo = h01;
    hi = h23;
  }
#else
  // Byte k of x becomes 16-bit lane k: the sign to bit 15, exponent and mantissa below Elem's
  // exponent field's top (shifted 4 for bf16's 8-bit exponent, 7 for fp16's 5-bit one), then
  // times 2^120 (bf16) or 2^8 (fp16), the difference of the exponent biases. The addend -0 keeps
  // the sign of zero.
  // (The constants are set inside the asm so that they hold no register across the main loop.)
  constexpr int kShift = kBF16 ? 4 : 7;
  const uint32_t sign = x & 0x80808080u;
  const uint32_t mag = x & 0x7f7f7f7fu;
  const uint32_t raw_lo = __byte_perm(sign, 0, 0x1404) | (__byte_perm(mag, 0, 0x4140) << kShift);
  const uint32_t raw_hi = __byte_perm(sign, 0, 0x3424) | (__byte_perm(mag, 0, 0x4342) << kShift);
  if constexpr (kBF16)  // 2^120 in each bf16 lane
    asm("{\n.reg .b32 f, z;\nmov.b32 f, 0x7b807b80;\nmov.b32 z, 0x80008000;\n"
        "fma.rn.bf16x2 %0, %2, f, z;\nfma.rn.bf16x2 %1, %3, f, z;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(raw_lo), "r"(raw_hi));
  else  // 2^8 in each fp16 lane
    asm("{\n.reg .b32 f, z;\nmov.b32 f, 0x5c005c00;\nmov.b32 z, 0x80008000;\n"
        "fma.rn.f16x2 %0, %2, f, z;\nfma.rn.f16x2 %1, %3, f, z;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(raw_lo), "r"(raw_hi));
#endif
}

// A bf16 pair as an fp16 pair for the MMAs of an fp8 pool (round to nearest; magnitudes above
// fp16's 65504 saturate to +-65504, NaN stays NaN). Exact for bf16 values of magnitude 2^-14 to
// 65504: every such bf16 (8 significant bits) is an fp16 (11).
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t x) {
  // bf16 -> fp32 is exact (the bits move up 16), then one saturating conversion per pair.
  const float lo = __uint_as_float(x << 16), hi = __uint_as_float(x & 0xffff0000u);
  uint32_t bits;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(bits) : "f"(hi), "f"(lo));
  return bits;
}

// x rounded to float8_e4m3fn and back, as SGLang's Triton fp8 path rounds its MMA operands
// (q.to(k.dtype), p.to(v.dtype): cvt.rn.satfinite.e4m3x2.f32): round to nearest even, magnitudes
// at or above 448 to +-448, NaN stays NaN. Written with fp32 arithmetic so that sm_80, which has no
// fp8 conversion, gives the same bits: 4 significant bits from 2^-6 up (the mantissa's 20 low
// fp32 bits rounded away), a quantum of 2^-9 below (e4m3's subnormals).
__device__ __forceinline__ float round_e4m3(float x) {
  const float a = fabsf(x);
  if (!(a < 448.f)) return a == a ? copysignf(448.f, x) : x;
  float r;
  if (a >= 0.015625f) {
    const uint32_t b = __float_as_uint(a);
    r = __uint_as_float((b + 0x7ffffu + ((b >> 20) & 1u)) & 0xfff00000u);
  } else {
    r = rintf(a * 512.f) * (1.f / 512.f);
  }
  return copysignf(fminf(r, 448.f), x);
}

// An fp16 pair with each value rounded to e4m3 (round_e4m3; every e4m3 value is an fp16).
__device__ __forceinline__ uint32_t f16x2_round_e4m3(uint32_t x) {
  __half2 v;
  memcpy(&v, &x, sizeof(v));
  const float2 f = __half22float2(v);
  const __half2 r = __floats2half2_rn(round_e4m3(f.x), round_e4m3(f.y));
  uint32_t bits;
  memcpy(&bits, &r, sizeof(bits));
  return bits;
}

// x rounded to bf16 and back (round to nearest even).
__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

}  // namespace kdtree
