// sm_80-level tensor-core and shared-memory primitives (mma.sync m16n8k16 with fp32
// accumulation, ldmatrix), shared by the verify kernel and bench/csrc/mma_ceiling.cu so that the
// ceiling is measured with the very instruction wrappers the kernel issues.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kdtree {

// D += A B for one m16n8k16 tile with fp32 accumulation; TYPE is the PTX type of A and B.
#define KDTREE_MMA_M16N8K16(TYPE, c, a, b0, b1)                                            \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE                       \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"              \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

// Element-type operations of the kernels: Elem is __nv_bfloat16 or __half.
template <typename Elem>
struct ElemOps {
  static constexpr bool kBF16 = std::is_same_v<Elem, __nv_bfloat16>;
  static_assert(kBF16 || std::is_same_v<Elem, __half>, "bf16 or fp16 only");

  // Two floats rounded to Elem, packed as one 32-bit MMA operand register.
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    const auto v = [&] {
      if constexpr (kBF16)
        return __floats2bfloat162_rn(a, b);
      else
        return __floats2half2_rn(a, b);
    }();
    uint32_t bits;
    memcpy(&bits, &v, sizeof(bits));
    return bits;
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    if constexpr (kBF16)
      KDTREE_MMA_M16N8K16("bf16", c, a, b0, b1);
    else
      KDTREE_MMA_M16N8K16("f16", c, a, b0, b1);
  }
};

#undef KDTREE_MMA_M16N8K16

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
