// The tensor-core rate that sm_80-level code can reach on this GPU: a ceiling for the verify
// kernel, which may use only mma.sync (no wgmma), measured the same way it runs.
//
//   variant 0  "registers": every warp streams HMMA m16n8k16 (bf16 in, fp32 accumulate) over
//              kChains independent accumulators from fragments held in registers: the issue-rate
//              ceiling of mma.sync.
//   variant 1  "ldmatrix": as the verify kernel's main loop feeds its MMAs, every ldmatrix.x4 of a
//              B operand from shared memory feeds 4 MMAs (2 n8 tiles x 2 m16 tiles).
//   variant 2  "registers_fp8": variant 0 with mma.sync m16n8k32 e4m3 x e4m3 (fp32 accumulate)
//              where the GPU has it in hardware (sm_89, sm_100 and later, sm_120 included): what an
//              fp8-operand kernel could reach with the same instructions. sm_90 has no fp8
//              mma.sync: ptxas emulates it (e4m3 unpacked to fp16, HMMA products, separate fp32
//              adds), so the products of constant operands leave the loop and a "rate" there would
//              mean nothing; the host refuses the variant on sm_90.
//
// Host entry point (C ABI, loaded with ctypes by bench/kdtree_bench/kernel/mma_ceiling.py): runs
// `reps` launches of `blocks` x `threads` and returns the mean milliseconds per launch, or a
// negative CUDA error code.
#include <cuda_runtime.h>

#include <cstdint>

#include "mma_sm80.h"  // kernel/csrc: the verify kernel's own mma.sync / ldmatrix wrappers

namespace {

constexpr int kChains = 8;

using Mma = kdtree::ElemOps<__nv_bfloat16>;

__global__ void mma_registers(float* out, int iters) {
  const uint32_t seed = threadIdx.x * 2654435761u;
  uint32_t a[4] = {seed & 0x3f803f80u, (seed >> 1) & 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
  const uint32_t b0 = 0x3f803f80u, b1 = seed & 0x3f803f80u;
  float c[kChains][4] = {};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int k = 0; k < kChains; ++k) Mma::mma(c[k], a, b0, b1);
  }
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < kChains; ++k) sum += c[k][0] + c[k][1] + c[k][2] + c[k][3];
  if (sum == 12345.f) out[threadIdx.x] = sum;  // keeps the MMAs alive, never true in practice
}

__global__ void mma_registers_fp8(float* out, int iters) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const uint32_t seed = threadIdx.x * 2654435761u;
  // e4m3 values near 1 (0x38 = 1.0); a different A per chain, so no two chains are the same
  // computation (sm_90 has no fp8 MMA: ptxas lowers it to fp16 HMMA, and would merge equal chains)
  uint32_t a[kChains][4];
#pragma unroll
  for (int k = 0; k < kChains; ++k) {
    a[k][0] = (seed & 0x38383838u) | (k * 0x01010101u);
    a[k][1] = ((seed >> 1) & 0x38383838u) | (k * 0x01010101u);
    a[k][2] = a[k][3] = 0x38383838u | (k * 0x01010101u);
  }
  const uint32_t b0 = 0x38383838u, b1 = seed & 0x38383838u;
  float c[kChains][4] = {};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int k = 0; k < kChains; ++k)
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
          "{%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(c[k][0]), "+f"(c[k][1]), "+f"(c[k][2]), "+f"(c[k][3])
          : "r"(a[k][0]), "r"(a[k][1]), "r"(a[k][2]), "r"(a[k][3]), "r"(b0), "r"(b1));
  }
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < kChains; ++k) sum += c[k][0] + c[k][1] + c[k][2] + c[k][3];
  if (sum == 12345.f) out[threadIdx.x] = sum;
#else
  __trap();  // the host refuses this variant below sm_89
#endif
}

__global__ void mma_ldmatrix(float* out, int iters) {
  __shared__ __align__(16) uint16_t tile[64 * 64];  // 8 KB of bf16 operand tiles
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) tile[i] = 0x3f80;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  uint32_t a[2][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int j = 0; j < 4; ++j) a[m][j] = 0x3f803f80u ^ (m + j);
  float c[kChains][4] = {};
  // lane -> row of the 8x8 matrix it addresses; 128-byte rows, XOR-swizzled 16-byte chunks
  const int row = (warp * 8 + (lane & 7)) & 63;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(tile)) + row * 128;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int k = 0; k < kChains / 4; ++k) {
      const int chunk = ((lane >> 3) + 4 * k + i) & 7;
      uint32_t r[4];
      kdtree::ldmatrix_x4(r, base + ((chunk ^ (row & 7)) << 4));
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        Mma::mma(c[4 * k + 2 * m], a[m], r[0], r[1]);
        Mma::mma(c[4 * k + 2 * m + 1], a[m], r[2], r[3]);
      }
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < kChains; ++k) sum += c[k][0] + c[k][1] + c[k][2] + c[k][3];
  if (sum == 12345.f) out[threadIdx.x] = sum;
}

}  // namespace

extern "C" float mma_ceiling_ms(int variant, int blocks, int threads, int iters, int reps) {
  if (variant == 2) {  // fp8 mma.sync in hardware: sm_89, sm_100 and later (not sm_80, sm_90)
    int device = 0, major = 0, minor = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    const bool fp8_mma = (major == 8 && minor >= 9) || major >= 10;
    if (err == cudaSuccess && !fp8_mma) err = cudaErrorNotSupported;
    if (err != cudaSuccess) return -static_cast<float>(err);
  }
  float* out = nullptr;
  const cudaError_t alloc = cudaMalloc(&out, 4096 * sizeof(float));
  if (alloc != cudaSuccess) return -static_cast<float>(alloc);
  auto launch = [&] {
    if (variant == 0) mma_registers<<<blocks, threads>>>(out, iters);
    else if (variant == 1) mma_ldmatrix<<<blocks, threads>>>(out, iters);
    else mma_registers_fp8<<<blocks, threads>>>(out, iters);
  };
  launch();  // warm-up
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  for (int r = 0; r < reps; ++r) launch();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  const cudaError_t err = cudaGetLastError();
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(out);
  return err == cudaSuccess ? ms / reps : -static_cast<float>(err);
}

// MMAs one warp issues in a launch of any variant (16 x 8 x 16 x 2 = 4096 FLOP each for bf16,
// 16 x 8 x 32 x 2 = 8192 for fp8).
extern "C" long long mma_ceiling_mmas_per_warp(int variant, int iters) {
  (void)variant;
  return static_cast<long long>(iters) * kChains;
}
