// How fast one CTA per SM can gather paged KV rows (1152 B each, rows picked by an index list)
// into a shared-memory ring, with nothing else to do: the cost of the verify kernel's loads on
// their own, per issue method.
//   method 0  cp.async: all 256 threads issue 9 16-byte copies per 32-row tile (the kernel's way;
//             8 threads per row), cp.async.wait_group + __syncthreads per tile
//   method 1  cp.async.bulk: the 32 lanes of warp 0 issue one 1152-byte bulk copy each (rows
//             padded to 1168 B in shared memory), completing on the stage's mbarrier
//   method 2  cp.async.bulk: thread 0 issues the 32 bulk copies of a tile alone
// Every thread waits for each tile (as the kernel's consumers do), then the stage is reissued.
// Thread 0 of each CTA records clock64() cycles over its tiles.
//
// Host entry point (C ABI, loaded with ctypes by bench/kdtree_bench/kernel/gather_ceiling.py):
// fills `cycles` with one count per CTA and returns the milliseconds of the timed launch (after a
// warm-up launch), or a negative CUDA error code.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kRows = 32;         // KV rows per tile
constexpr int kRowBytes = 1152;   // 576 bf16
constexpr int kPaddedRow = 1168;  // bulk copies cannot swizzle: pad so ldmatrix rows differ in bank
constexpr int kThreads = 256;
constexpr int kStageBytes = kRows * kPaddedRow;  // the larger of the two layouts
constexpr int kTileBytes = kRows * kRowBytes;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
// mbarriers and bulk copies are sm_90+ (sm_120 included); an sm_80 build measures method 0 only.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define GATHER_HAS_BULK 1
#else
#define GATHER_HAS_BULK 0
#endif
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
#if GATHER_HAS_BULK
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
#endif
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, int bytes) {
#if GATHER_HAS_BULK
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if GATHER_HAS_BULK
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, int bytes, uint32_t bar) {
#if GATHER_HAS_BULK
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#endif
}

template <int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    gather(const uint8_t* __restrict__ pool, const int32_t* __restrict__ idx, int tiles, int method,
           long long* cycles, int* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t bars[kStages];
  const int tid = threadIdx.x;
  const int32_t* my_idx = idx + static_cast<int64_t>(blockIdx.x) * tiles * kRows;
  const uint32_t base = smem_addr(smem);
  if (tid == 0)
    for (int s = 0; s < kStages; ++s) mbar_init(smem_addr(&bars[s]), 1);
#if GATHER_HAS_BULK
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
  __syncthreads();

  auto issue = [&](int t) {
    if (t >= tiles) return;
    const int stage = t % kStages;
    const uint32_t dst = base + stage * kStageBytes;
    if (method == 0) {
      const int row = tid / 8, sub = tid % 8;
      const uint8_t* src = pool + static_cast<int64_t>(my_idx[t * kRows + row]) * kRowBytes;
#pragma unroll
      for (int i = 0; i < 9; ++i)
        cp_async_16(dst + row * kRowBytes + (sub + 8 * i) * 16, src + (sub + 8 * i) * 16);
    } else {
      const uint32_t bar = smem_addr(&bars[stage]);
      const int lanes = method == 1 ? 32 : 1;
      if (tid < lanes) {
        if (tid == 0) mbar_expect_tx(bar, kTileBytes);
        __syncwarp(method == 1 ? 0xffffffffu : 1u);
        for (int r = tid; r < kRows; r += lanes)
          bulk_copy(dst + r * kPaddedRow,
                    pool + static_cast<int64_t>(my_idx[t * kRows + r]) * kRowBytes, kRowBytes, bar);
      }
    }
  };

  long long start = clock64();
  int acc = 0;
  for (int t = 0; t < kStages - 1; ++t) {
    issue(t);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  for (int t = 0; t < tiles; ++t) {
    const int stage = t % kStages;
    if (method == 0) {
      asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");
    } else {
      mbar_wait(smem_addr(&bars[stage]), (t / kStages) & 1);
    }
    __syncthreads();  // the tile is everyone's; everyone is done with tile t - 1's stage
    acc += smem[stage * kStageBytes + (tid % kRows) * kRowBytes];
    issue(t + kStages - 1);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
  if (tid == 0) cycles[blockIdx.x] = clock64() - start;
  if (acc == 0x7fffffff) sink[0] = acc;  // keeps the shared-memory reads
}

template <int kStages>
float launch(const uint8_t* pool, const int32_t* idx, int blocks, int tiles, int method,
             long long* cycles, int* sink) {
  const int smem = kStages * kStageBytes;
  cudaFuncSetAttribute(gather<kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  gather<kStages><<<blocks, kThreads, smem>>>(pool, idx, tiles, method, cycles, sink);  // warm-up
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  gather<kStages><<<blocks, kThreads, smem>>>(pool, idx, tiles, method, cycles, sink);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

}  // namespace

// pool_rows rows of 1152 B; idx: blocks * tiles * 32 row indices (host array, copied here).
extern "C" float gather_ms(long long pool_rows, const int32_t* host_idx, int blocks, int tiles,
                           int method, int stages, long long* host_cycles) {
  // Refused before anything is allocated: the bulk-copy methods below sm_90, unknown depths.
  int device = 0, major = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess && method != 0 && major < 9) err = cudaErrorNotSupported;
  if (err == cudaSuccess && stages != 2 && stages != 4) err = cudaErrorInvalidValue;
  if (err != cudaSuccess) return -static_cast<float>(err);
  uint8_t* pool = nullptr;
  int32_t* idx = nullptr;
  long long* cycles = nullptr;
  int* sink = nullptr;
  const size_t n_idx = static_cast<size_t>(blocks) * tiles * kRows;
  err = cudaMalloc(&pool, pool_rows * kRowBytes);
  if (err == cudaSuccess) err = cudaMalloc(&idx, n_idx * sizeof(int32_t));
  if (err == cudaSuccess) err = cudaMalloc(&cycles, blocks * sizeof(long long));
  if (err == cudaSuccess) err = cudaMalloc(&sink, sizeof(int));
  if (err == cudaSuccess) err = cudaMemset(pool, 0, pool_rows * kRowBytes);
  if (err == cudaSuccess)
    err = cudaMemcpy(idx, host_idx, n_idx * sizeof(int32_t), cudaMemcpyHostToDevice);
  float ms = 0.f;
  if (err == cudaSuccess) {
    ms = stages == 2 ? launch<2>(pool, idx, blocks, tiles, method, cycles, sink)
                     : launch<4>(pool, idx, blocks, tiles, method, cycles, sink);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess)
    err = cudaMemcpy(host_cycles, cycles, blocks * sizeof(long long), cudaMemcpyDeviceToHost);
  cudaFree(pool);
  cudaFree(idx);
  cudaFree(cycles);
  cudaFree(sink);
  return err == cudaSuccess ? ms : -static_cast<float>(err);
}
