// How fast the SMs can read from L2: the ceiling for a kernel whose every row tile re-reads the
// same KV tiles from L2 (the verify kernel at many heads x draft tokens). Every thread streams
// 16-byte `ld.global.cg` loads (cached in L2 only, so no L1 hit inflates the rate) over a buffer
// of `bytes`, `passes` times; with a buffer that fits in L2, every load after the first pass is
// an L2 hit, and with one far larger than L2 the rate is DRAM's.
//
// Host entry point (C ABI, loaded with ctypes by bench/kdtree_bench/kernel/l2_ceiling.py): returns
// the milliseconds of one timed launch (after a warm-up launch that also fills L2), or a negative
// CUDA error code.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

__global__ void read_stream(const int4* __restrict__ buf, int64_t n, int passes, int4* out) {
  int4 acc = make_int4(0, 0, 0, 0);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int p = 0; p < passes; ++p) {
#pragma unroll 8
    for (int64_t i = first; i < n; i += stride) {
      const int4 v = __ldcg(buf + i);
      acc.x ^= v.x;
      acc.y ^= v.y;
      acc.z ^= v.z;
      acc.w ^= v.w;
    }
  }
  if ((acc.x & acc.y & acc.z & acc.w) == -1) out[0] = acc;  // keeps the loads; the buffer is zeros
}

}  // namespace

extern "C" float l2_read_ms(long long bytes, int passes, int blocks, int threads) {
  int4* buf = nullptr;
  int4* out = nullptr;
  cudaError_t err = cudaMalloc(&buf, bytes);
  if (err == cudaSuccess) err = cudaMalloc(&out, sizeof(int4));
  if (err == cudaSuccess) err = cudaMemset(buf, 0, bytes);
  float ms = 0.f;
  if (err == cudaSuccess) {
    const int64_t n = bytes / static_cast<long long>(sizeof(int4));
    read_stream<<<blocks, threads>>>(buf, n, 1, out);  // warm-up: fills L2 where it fits
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start);
    read_stream<<<blocks, threads>>>(buf, n, passes, out);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    cudaEventElapsedTime(&ms, start, stop);
    err = cudaGetLastError();
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  cudaFree(buf);
  cudaFree(out);
  return err == cudaSuccess ? ms : -static_cast<float>(err);
}
