// MLA tree-verify attention (DeepSeek-V3 absorbed MLA: Q/K 576 = 512 latent + 64 rope, V = first
// 512 columns of the same latent KV row) for speculative-decoding verify, sm_80-level ISA only
// (mma.sync m16n8k16, ldmatrix, cp.async) so the same code runs on sm_80, sm_90 and sm_120.
//
// Three kernels, all launched on the caller's stream, none synchronizing with the host:
//   plan_kernel       once per forward: per-request metadata, row-tile table and KV split size,
//                     computed on the device from qo_indptr / kv_indptr (CUDA-graph safe).
//   attention_kernel  one CTA per (row tile, KV split). A row tile is 32 (draft token, head) rows
//                     of one request; each 32-token KV tile is loaded once (cp.async, double
//                     buffered) and used by all 32 rows. The "virtual sequence" of a request is its
//                     prefix (kv_indices -> k_buffer) followed by its N draft tokens (k_extend),
//                     so the tree-masked draft block is just the tail of the last split.
//   combine_kernel    log-sum-exp merge of the splits' normalized partials (requests with one
//                     split are written directly by the attention kernel and skipped here).
//
// Warp layout of the attention kernel (8 warps): warp = group * 4 + quarter. A group owns 16 rows.
// S = Q K^T: each warp of the group reduces over its 144-column quarter of the 576 dims with its Q
// fragments held in registers, then the 4 partial S tiles are summed through shared memory.
// O += P V: each warp owns a 128-column quarter of the 512 V columns (64 fp32 accumulators), so
// the 16 x 512 fp32 output accumulator is spread over the 4 warps.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "verify_config.h"
#include "verify_params.h"

namespace kdtree {
namespace {

constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ int64_t load_index(const void* ptr, bool is64, int64_t i) {
  return is64 ? reinterpret_cast<const int64_t*>(ptr)[i]
              : static_cast<int64_t>(reinterpret_cast<const int32_t*>(ptr)[i]);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <typename Elem>
struct ElemOps;

template <>
struct ElemOps<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct ElemOps<__half> {
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

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

// 16-byte async copy; src_bytes = 0 zero-fills the destination (used for tokens past the end so
// that no stale shared memory, possibly NaN, reaches the P*V MMA).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// 4- or 8-byte async copy (kv_indices are only element-aligned); src_bytes = 0 zero-fills.
__device__ __forceinline__ void cp_async_index(uint32_t dst, const void* src, bool is64,
                                               bool valid) {
  if (is64)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 8 : 0));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 4 : 0));
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void group_barrier(int group) {
  // Named barrier per 16-row group (ids 1..kRowGroups; 0 is __syncthreads).
  asm volatile("bar.sync %0, %1;\n" ::"r"(group + 1), "r"(kWarpsPerGroup * 32) : "memory");
}

__device__ __forceinline__ uint32_t load_u32(const void* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// ---------------------------------------------------------------------------------------------
// Plan: one CTA. Two passes over the requests (each thread owns a contiguous run of requests):
// pass 1 counts row tiles / mask sizes / work, a block scan turns counts into offsets, pass 2
// writes RequestMeta and the row-tile table. The KV split size ("chunk") is uniform over the
// batch: total work / target CTAs, at least ceil(max_len / max_splits), rounded to kBlockN.
constexpr int kPlanThreads = 1024;

__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const VerifyParams p) {
  __shared__ int64_t s_tiles[kPlanThreads];
  __shared__ int64_t s_mask[kPlanThreads];
  __shared__ int64_t s_work[kPlanThreads / 32];
  __shared__ int64_t s_maxlen[kPlanThreads / 32];
  __shared__ int s_chunk;
  const int tid = threadIdx.x;
  const int B = p.batch;
  const int H = p.num_heads;
  const int per = (B + kPlanThreads - 1) / kPlanThreads;
  const int b_begin = min(B, tid * per);
  const int b_end = min(B, b_begin + per);

  auto request_shape = [&](int b, int64_t& n, int64_t& L) {
    n = load_index(p.qo_indptr, p.qo_indptr_64, b + 1) - load_index(p.qo_indptr, p.qo_indptr_64, b);
    L = load_index(p.kv_indptr, p.kv_indptr_64, b + 1) - load_index(p.kv_indptr, p.kv_indptr_64, b);
    n = n < 0 ? 0 : n;  // malformed indptr: treat as empty rather than corrupt memory
    L = L < 0 ? 0 : L;
  };

  int64_t my_tiles = 0, my_mask = 0, my_work = 0, my_maxlen = 0;
  for (int b = b_begin; b < b_end; ++b) {
    int64_t n, L;
    request_shape(b, n, L);
    const int64_t tiles = (n * H + kBlockM - 1) / kBlockM;
    const int64_t len = L + n;
    my_tiles += tiles;
    my_mask += n * len;
    my_work += tiles * len;
    if (tiles > 0 && len > my_maxlen) my_maxlen = len;
  }
  s_tiles[tid] = my_tiles;
  s_mask[tid] = my_mask;
  // Warp-level reductions of work (sum) and max length.
  int64_t w = my_work, mx = my_maxlen;
  for (int off = 16; off > 0; off >>= 1) {
    w += __shfl_xor_sync(0xffffffffu, w, off);
    const int64_t o = __shfl_xor_sync(0xffffffffu, mx, off);
    mx = o > mx ? o : mx;
  }
  if ((tid & 31) == 0) {
    s_work[tid >> 5] = w;
    s_maxlen[tid >> 5] = mx;
  }
  __syncthreads();
  // Inclusive Hillis-Steele scan of tiles and mask sizes (1024 entries, 10 steps).
  for (int off = 1; off < kPlanThreads; off <<= 1) {
    const int64_t a = tid >= off ? s_tiles[tid - off] : 0;
    const int64_t c = tid >= off ? s_mask[tid - off] : 0;
    __syncthreads();
    s_tiles[tid] += a;
    s_mask[tid] += c;
    __syncthreads();
  }
  if (tid == 0) {
    int64_t total_work = 0, max_len = 0;
    for (int i = 0; i < kPlanThreads / 32; ++i) {
      total_work += s_work[i];
      max_len = s_maxlen[i] > max_len ? s_maxlen[i] : max_len;
    }
    const int64_t target = p.target_ctas > 0 ? p.target_ctas : 1;
    int64_t chunk = (total_work + target - 1) / target;
    const int64_t by_cap = (max_len + p.max_splits - 1) / p.max_splits;
    chunk = chunk > by_cap ? chunk : by_cap;
    chunk = chunk > kChunkMinTokens ? chunk : kChunkMinTokens;
    chunk = (chunk + kBlockN - 1) / kBlockN * kBlockN;
    s_chunk = static_cast<int>(chunk);
    *p.chunk = static_cast<int32_t>(chunk);
  }
  __syncthreads();
  const int64_t chunk = s_chunk;
  int64_t tile_pos = s_tiles[tid] - my_tiles;
  int64_t mask_pos = s_mask[tid] - my_mask;
  const int64_t total_tiles = s_tiles[kPlanThreads - 1];
  for (int b = b_begin; b < b_end; ++b) {
    int64_t n, L;
    request_shape(b, n, L);
    const int64_t tiles = (n * H + kBlockM - 1) / kBlockM;
    const int64_t len = L + n;
    RequestMeta m;
    m.kv_start = load_index(p.kv_indptr, p.kv_indptr_64, b);
    m.mask_start = p.mask_indptr != nullptr ? load_index(p.mask_indptr, p.mask_indptr_64, b)
                                            : mask_pos;
    m.qo_start = static_cast<int32_t>(load_index(p.qo_indptr, p.qo_indptr_64, b));
    m.num_q = static_cast<int32_t>(n);
    m.prefix_len = static_cast<int32_t>(L);
    m.num_splits = tiles > 0 ? static_cast<int32_t>((len + chunk - 1) / chunk) : 0;
    p.req[b] = m;
    for (int64_t i = 0; i < tiles; ++i) {
      if (tile_pos + i < p.num_tile_slots) {  // the host bound makes this always true
        p.tile_req[tile_pos + i] = b;
        p.tile_mt[tile_pos + i] = static_cast<int32_t>(i);
      }
    }
    tile_pos += tiles;
    mask_pos += n * len;
  }
  for (int64_t i = total_tiles + tid; i < p.num_tile_slots; i += kPlanThreads) {
    p.tile_req[i] = -1;
    p.tile_mt[i] = 0;
  }
}

// ---------------------------------------------------------------------------------------------
// Byte offset of 16-byte chunk `chunk` of KV row `row` inside a stage (XOR swizzle, see config).
__device__ __forceinline__ uint32_t kv_offset(int row, int chunk) {
  return row * kKvRowBytes + ((chunk ^ (row & 7)) << 4);
}

template <typename Elem>
__global__ void __launch_bounds__(kThreads, 1) attention_kernel(const VerifyParams p) {
  constexpr int kNT = kBlockN / 8;         // n8 tiles of S per warp
  constexpr int kLoadThreadsPerRow = kThreads / kBlockN;
  constexpr int kLoadIters = (kKvRowChunks + kLoadThreadsPerRow - 1) / kLoadThreadsPerRow;
  static_assert(kThreads % kBlockN == 0 && kBlockN % 16 == 0, "loader / MMA tiling");
  extern __shared__ __align__(128) uint8_t smem[];
  const int slot = blockIdx.x;
  const int split = blockIdx.y;
  const int b = p.tile_req[slot];
  if (b < 0) return;
  const RequestMeta meta = p.req[b];
  if (split >= meta.num_splits) return;
  const int mt = p.tile_mt[slot];
  const int chunk = *p.chunk;
  const int L = meta.prefix_len;
  const int len = L + meta.num_q;
  const int kv_begin = split * chunk;
  const int kv_end = min(len, kv_begin + chunk);
  const int n_tiles = (kv_end - kv_begin + kBlockN - 1) / kBlockN;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int group = warp / kWarpsPerGroup;
  const int quarter = warp % kWarpsPerGroup;
  const int H = p.num_heads;
  const int rows = meta.num_q * H;

  // The two rows this thread holds in the MMA fragment layouts (lane/4 and lane/4 + 8).
  int row_local[2], row_t[2], row_h[2];
  bool row_valid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row_local[i] = group * 16 + (lane >> 2) + 8 * i;
    const int m = mt * kBlockM + row_local[i];
    row_valid[i] = m < rows;
    row_t[i] = row_valid[i] ? m / H : 0;
    row_h[i] = row_valid[i] ? m % H : 0;
  }

  // Loader mapping: kLoadThreadsPerRow threads per KV row, 16-byte chunks strided by that count.
  const int ld_row = tid / kLoadThreadsPerRow;
  const int ld_sub = tid % kLoadThreadsPerRow;
  const Elem* k_buf = reinterpret_cast<const Elem*>(p.k_buf);
  const Elem* v_buf = reinterpret_cast<const Elem*>(p.v_buf);
  const Elem* k_ext = reinterpret_cast<const Elem*>(p.k_ext);
  const Elem* v_ext = reinterpret_cast<const Elem*>(p.v_ext);
  struct Src {
    const Elem* k;
    const Elem* v;
    bool valid;
  };
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint8_t* idx_ring = smem + kStages * kKvStageBytes + kXchBytes;
  const uint32_t idx_ring_smem = smem_base + kStages * kKvStageBytes + kXchBytes;
  // Source rows of this thread's KV row in `tile`; the prefix index comes from the ring
  // (from_ring) or straight from global memory (pipeline prologue and the separate-V path).
  auto resolve = [&](int tile, bool from_ring) -> Src {
    const int j = kv_begin + tile * kBlockN + ld_row;
    Src s{k_buf, v_buf, false};
    if (tile < n_tiles && j < kv_end) {
      s.valid = true;
      if (j < L) {
        int64_t idx;
        if (from_ring) {
          const uint8_t* slot = idx_ring + (tile % kIdxRing) * kIdxSlotBytes;
          idx = p.kv_indices_64 ? reinterpret_cast<const int64_t*>(slot)[ld_row]
                                : reinterpret_cast<const int32_t*>(slot)[ld_row];
        } else {
          idx = load_index(p.kv_indices, p.kv_indices_64, meta.kv_start + j);
        }
        s.k = k_buf + idx * p.k_buf_stride;
        s.v = v_buf + idx * p.v_buf_stride;
      } else {
        const int64_t e = meta.qo_start + (j - L);
        s.k = k_ext + e * p.k_ext_stride;
        s.v = v_ext + e * p.v_ext_stride;
      }
    }
    return s;
  };
  // Fetch the kBlockN prefix indices of `tile` into its ring slot (threads 0..kBlockN-1).
  auto issue_idx = [&](int tile) {
    if (tid < kBlockN) {
      const int j = kv_begin + tile * kBlockN + tid;
      const bool valid = tile < n_tiles && j < min(L, kv_end);
      const int elem = p.kv_indices_64 ? 8 : 4;
      const void* src = valid ? static_cast<const uint8_t*>(p.kv_indices) +
                                    (meta.kv_start + j) * static_cast<int64_t>(elem)
                              : p.k_buf;
      cp_async_index(idx_ring_smem + (tile % kIdxRing) * kIdxSlotBytes + tid * elem, src,
                     p.kv_indices_64, valid);
    }
  };
  auto issue_k = [&](int stage, const Src& s) {
    const uint32_t dst = smem_base + stage * kKvStageBytes;
#pragma unroll
    for (int i = 0; i < kLoadIters; ++i) {
      const int c = ld_sub + kLoadThreadsPerRow * i;
      if (c < kKvRowChunks)
        cp_async_16(dst + kv_offset(ld_row, c), s.k + c * 8, s.valid ? 16 : 0);
    }
  };
  auto issue_v = [&](int stage, const Src& s) {
    const uint32_t dst = smem_base + stage * kKvStageBytes;
#pragma unroll
    for (int i = 0; i < kLoadIters; ++i) {
      const int c = ld_sub + kLoadThreadsPerRow * i;
      if (c < kHeadDimV / 8)
        cp_async_16(dst + kv_offset(ld_row, c), s.v + c * 8, s.valid ? 16 : 0);
    }
  };

  // Start the KV pipeline first (kStages - 1 tiles), then load Q while those copies fly.
  // Group t carries KV tile t and the indices of tile t + kStages - 1; iteration `it` then issues
  // KV tile it + kStages - 1 (indices landed with group it) and the indices of it + 2(kStages-1).
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < n_tiles) issue_k(t, resolve(t, false));
    issue_idx(t + kStages - 1);
    cp_async_commit();
  }

  // Q fragments (A operand, 16 rows x this warp's 144 columns) straight from global memory.
  const Elem* q = reinterpret_cast<const Elem*>(p.q);
  uint32_t qf[kQkSlice / 16][4];
  {
    const Elem* qrow[2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
      qrow[i] = q + static_cast<int64_t>(meta.qo_start + row_t[i]) * p.q_stride_tok +
                static_cast<int64_t>(row_h[i]) * p.q_stride_head;
#pragma unroll
    for (int kk = 0; kk < kQkSlice / 16; ++kk) {
      const int d = quarter * kQkSlice + kk * 16 + (lane & 3) * 2;
      qf[kk][0] = row_valid[0] ? load_u32(qrow[0] + d) : 0u;
      qf[kk][1] = row_valid[1] ? load_u32(qrow[1] + d) : 0u;
      qf[kk][2] = row_valid[0] ? load_u32(qrow[0] + d + 8) : 0u;
      qf[kk][3] = row_valid[1] ? load_u32(qrow[1] + d + 8) : 0u;
    }
  }

  float4* xch = reinterpret_cast<float4*>(smem + kStages * kKvStageBytes);
  const uint8_t* mask_row[2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
    mask_row[i] = p.mask != nullptr
                      ? p.mask + meta.mask_start + static_cast<int64_t>(row_t[i]) * len
                      : nullptr;

  float o[kVSlice / 8][4];
#pragma unroll
  for (int nt = 0; nt < kVSlice / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
  float m_run[2] = {neg_inf(), neg_inf()};
  float l_run[2] = {0.f, 0.f};

  int stage = 0;
  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<kStages - 2>();  // tile `it` has landed (this thread's copies)
    __syncthreads();  // ... everyone's copies; and everyone is done with tile it-1's stage
    {
      // Refill the stage tile it-1 used with tile it + kStages - 1.
      const int fill = stage == 0 ? kStages - 1 : stage - 1;
      if (it + kStages - 1 < n_tiles) issue_k(fill, resolve(it + kStages - 1, true));
      issue_idx(it + 2 * (kStages - 1));
      cp_async_commit();
    }

    const uint32_t kv_smem = smem_base + stage * kKvStageBytes;
    // ---- partial S over this warp's 144 columns.
    float s[kNT][4];
#pragma unroll
    for (int n = 0; n < kNT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kQkSlice / 16; ++kk) {
      const int c = (quarter * kQkSlice + kk * 16) / 8 + ((lane >> 3) & 1);
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        const int tok = np * 16 + (lane & 7) + ((lane >> 4) << 3);
        uint32_t r[4];
        ldmatrix_x4(r, kv_smem + kv_offset(tok, c));
        ElemOps<Elem>::mma(s[2 * np], qf[kk], r[0], r[1]);
        ElemOps<Elem>::mma(s[2 * np + 1], qf[kk], r[2], r[3]);
      }
    }
    // ---- sum the group's 4 partial S tiles through shared memory.
#pragma unroll
    for (int n = 0; n < kNT; ++n)
      xch[(warp * kNT + n) * 32 + lane] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
    group_barrier(group);
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int w = 0; w < kWarpsPerGroup; ++w) {
        const float4 v = xch[((group * kWarpsPerGroup + w) * kNT + n) * 32 + lane];
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
      }
      s[n][0] = acc.x;
      s[n][1] = acc.y;
      s[n][2] = acc.z;
      s[n][3] = acc.w;
    }

    // ---- scale (log2 domain) and mask: prefix columns are all visible; draft columns follow
    // the tree mask (or causal order); columns past this split's end are invisible.
    const int tile_start = kv_begin + it * kBlockN;
    const bool needs_mask = tile_start + kBlockN > min(L, kv_end);
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[n][e] * p.scale_log2;
        if (needs_mask) {
          const int j = tile_start + n * 8 + (lane & 3) * 2 + (e & 1);
          const int i = e >> 1;
          bool visible;
          if (j >= kv_end) {
            visible = false;
          } else if (j < L || !row_valid[i]) {
            visible = true;
          } else if (mask_row[i] != nullptr) {
            visible = mask_row[i][j] != 0;
          } else {
            visible = (j - L) <= row_t[i];
          }
          if (!visible) v = neg_inf();
        }
        s[n][e] = v;
      }
    }

    // ---- online softmax (identical in the 4 warps of a group).
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = neg_inf();
#pragma unroll
      for (int n = 0; n < kNT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[i], mx);
      const float m_use = m_new == neg_inf() ? 0.f : m_new;  // a fully masked row so far
      alpha[i] = fast_exp2(m_run[i] - m_use);
      m_run[i] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        s[n][2 * i] = fast_exp2(s[n][2 * i] - m_use);
        s[n][2 * i + 1] = fast_exp2(s[n][2 * i + 1] - m_use);
        sum += s[n][2 * i] + s[n][2 * i + 1];
      }
      l_run[i] = l_run[i] * alpha[i] + sum;
    }
#pragma unroll
    for (int nt = 0; nt < kVSlice / 8; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }

    // ---- V rows that are not the first 512 columns of the K rows: overwrite them in place.
    const bool has_prefix = tile_start < L;
    const bool has_draft = min(tile_start + kBlockN, kv_end) > L;
    if ((has_prefix && p.separate_v_buf) || (has_draft && p.separate_v_ext)) {
      __syncthreads();  // every warp has finished reading K from this stage
      issue_v(stage, resolve(it, false));  // slow path: a direct index lookup is fine
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
    }

    // ---- O += P V over this warp's 128 V columns. P's C fragments are the A fragments.
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks) {
      uint32_t pa[4];
      pa[0] = ElemOps<Elem>::pack(s[2 * ks][0], s[2 * ks][1]);
      pa[1] = ElemOps<Elem>::pack(s[2 * ks][2], s[2 * ks][3]);
      pa[2] = ElemOps<Elem>::pack(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      pa[3] = ElemOps<Elem>::pack(s[2 * ks + 1][2], s[2 * ks + 1][3]);
      const int tok = ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
      for (int np = 0; np < kVSlice / 16; ++np) {
        const int c = (quarter * kVSlice + np * 16) / 8 + (lane >> 4);
        uint32_t r[4];
        ldmatrix_x4_trans(r, kv_smem + kv_offset(tok, c));
        ElemOps<Elem>::mma(o[2 * np], pa, r[0], r[1]);
        ElemOps<Elem>::mma(o[2 * np + 1], pa, r[2], r[3]);
      }
    }
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }
  cp_async_wait<0>();  // nothing may be in flight into shared memory when the CTA exits

  // ---- epilogue: normalize; write the output directly (one split) or the partial.
  const bool direct = meta.num_splits == 1;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = l_run[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse = l > 0.f ? (m_run[i] + __log2f(l)) * kLn2 : neg_inf();
    if (!row_valid[i]) continue;
    const int col0 = quarter * kVSlice + (lane & 3) * 2;
    if (direct) {
      const int64_t tok = meta.qo_start + row_t[i];
      Elem* orow = reinterpret_cast<Elem*>(p.out) + tok * p.out_stride_tok +
                   static_cast<int64_t>(row_h[i]) * p.out_stride_head;
#pragma unroll
      for (int nt = 0; nt < kVSlice / 8; ++nt)
        *reinterpret_cast<uint32_t*>(orow + col0 + nt * 8) =
            ElemOps<Elem>::pack(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
      if (quarter == 0 && (lane & 3) == 0)
        p.lse[tok * p.lse_stride_tok + static_cast<int64_t>(row_h[i]) * p.lse_stride_head] = lse;
    } else {
      const int64_t prow =
          (static_cast<int64_t>(split) * p.num_tile_slots + slot) * kBlockM + row_local[i];
      float* orow = p.o_part + prow * kHeadDimV;
#pragma unroll
      for (int nt = 0; nt < kVSlice / 8; ++nt)
        *reinterpret_cast<float2*>(orow + col0 + nt * 8) =
            make_float2(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
      if (quarter == 0 && (lane & 3) == 0) p.lse_part[prow] = lse;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// One CTA per output row: LSE-weighted sum of the row's split partials (FlashInfer merge_state).
// Warp 0 turns the split LSEs into weights; the 8 warps then take every 8th split each (lane =
// 16 columns, 4 independent float4 loads per split) and the per-warp sums meet in shared memory.
// Splits that saw no visible token carry lse = -inf and zero output, and get weight 0.
template <typename Elem>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(const VerifyParams p) {
  __shared__ float weights[kMaxSplits];
  __shared__ float4 partial[kCombineWarps][kHeadDimV / 4];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t slot = blockIdx.x / kBlockM;
  const int r = blockIdx.x % kBlockM;
  if (slot >= p.num_tile_slots) return;
  const int b = p.tile_req[slot];
  if (b < 0) return;
  const RequestMeta meta = p.req[b];
  if (meta.num_splits <= 1) return;
  const int H = p.num_heads;
  const int m = p.tile_mt[slot] * kBlockM + r;
  if (m >= meta.num_q * H) return;
  const int t = m / H;
  const int h = m % H;
  const int64_t split_stride = static_cast<int64_t>(p.num_tile_slots) * kBlockM;
  const int64_t base = slot * kBlockM + r;
  const int ns = meta.num_splits;
  const int64_t tok = meta.qo_start + t;

  if (warp == 0) {
    constexpr int kPerLane = kMaxSplits / 32;
    float l[kPerLane];
    float mx = neg_inf();
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int s = lane + 32 * k;
      l[k] = s < ns ? p.lse_part[base + s * split_stride] : neg_inf();
      mx = fmaxf(mx, l[k]);
    }
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float m_use = mx == neg_inf() ? 0.f : mx;
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      l[k] = __expf(l[k] - m_use);
      sum += l[k];
    }
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k)
      if (lane + 32 * k < ns) weights[lane + 32 * k] = l[k] * inv;
    if (lane == 0)
      p.lse[tok * p.lse_stride_tok + static_cast<int64_t>(h) * p.lse_stride_head] =
          sum > 0.f ? m_use + __logf(sum) : neg_inf();
  }
  __syncthreads();
  float4 acc[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 2
  for (int s = warp; s < ns; s += kCombineWarps) {
    const float wgt = weights[s];
    const float4* src =
        reinterpret_cast<const float4*>(p.o_part + (base + s * split_stride) * kHeadDimV);
    float4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = src[k * 32 + lane];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      acc[k].x += wgt * v[k].x;
      acc[k].y += wgt * v[k].y;
      acc[k].z += wgt * v[k].z;
      acc[k].w += wgt * v[k].w;
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) partial[warp][k * 32 + lane] = acc[k];
  __syncthreads();
  if (threadIdx.x < kHeadDimV / 4) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) {
      const float4 v = partial[w][threadIdx.x];
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    Elem* orow = reinterpret_cast<Elem*>(p.out) + tok * p.out_stride_tok +
                 static_cast<int64_t>(h) * p.out_stride_head;
    uint2 packed;
    packed.x = ElemOps<Elem>::pack(sum.x, sum.y);
    packed.y = ElemOps<Elem>::pack(sum.z, sum.w);
    *reinterpret_cast<uint2*>(orow + threadIdx.x * 4) = packed;
  }
}

template <typename Elem>
void prepare_attention_kernel() {
  // Opt in to > 48 KB dynamic shared memory once per instantiation (not a stream operation, so
  // this is also fine during CUDA-graph capture).
  static const bool done = [] {
    cudaFuncSetAttribute(attention_kernel<Elem>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         kSmemBytes);
    return true;
  }();
  (void)done;
}

template <typename Elem>
void launch_attention_t(const VerifyParams& p, cudaStream_t stream) {
  prepare_attention_kernel<Elem>();
  const dim3 grid(p.num_tile_slots, p.max_splits);
  attention_kernel<Elem><<<grid, kThreads, kSmemBytes, stream>>>(p);
}

template <typename Elem>
void launch_combine_t(const VerifyParams& p, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(p.num_tile_slots) * kBlockM;  // one CTA per row
  combine_kernel<Elem><<<static_cast<unsigned>(rows), kCombineWarps * 32, 0, stream>>>(p);
}

}  // namespace

void launch_plan(const VerifyParams& p, cudaStream_t stream) {
  plan_kernel<<<1, kPlanThreads, 0, stream>>>(p);
}

void launch_attention(const VerifyParams& p, DType dtype, cudaStream_t stream) {
  if (dtype == DType::kBF16)
    launch_attention_t<__nv_bfloat16>(p, stream);
  else
    launch_attention_t<__half>(p, stream);
}

void launch_combine(const VerifyParams& p, DType dtype, cudaStream_t stream) {
  if (p.max_splits <= 1) return;  // every request is written directly by the attention kernel
  if (dtype == DType::kBF16)
    launch_combine_t<__nv_bfloat16>(p, stream);
  else
    launch_combine_t<__half>(p, stream);
}

int attention_ctas_per_sm(DType dtype) {
  int n = 0;
  if (dtype == DType::kBF16) {
    prepare_attention_kernel<__nv_bfloat16>();
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_kernel<__nv_bfloat16>, kThreads,
                                                  kSmemBytes);
  } else {
    prepare_attention_kernel<__half>();
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_kernel<__half>, kThreads,
                                                  kSmemBytes);
  }
  return n > 0 ? n : 1;
}

}  // namespace kdtree
