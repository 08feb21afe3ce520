// MLA tree-verify attention (DeepSeek-V3 absorbed MLA: Q/K 576 = 512 latent + 64 rope, V = first
// 512 columns of the same latent KV row) for speculative-decoding verify, sm_80-level ISA only
// (mma.sync m16n8k16, ldmatrix, cp.async) so the same code runs on sm_80, sm_90 and sm_120.
//
// Three kernels, all launched on the caller's stream, none synchronizing with the host:
//   plan_kernel       once per forward: the row-tile table (one TileMeta per tile, its request's
//                     metadata included) and the KV split size, computed on the device from
//                     qo_indptr / kv_indptr (CUDA-graph safe).
//   attention_kernel  one CTA per (row tile, KV split). A row tile is 32 (draft token, head) rows
//                     of one request; each 32-token KV tile is loaded once (cp.async, double
//                     buffered) and used by all 32 rows. The "virtual sequence" of a request is its
//                     prefix (kv_indices -> k_buffer) followed by its N draft tokens (k_extend),
//                     so the tree-masked draft block is just the tail of the last split.
//   combine_kernel    log-sum-exp merge of the splits' normalized partials (requests with one
//                     split are written directly by the attention kernel and skipped here). Two
//                     instantiations: the host takes the wide batch (a row's <= 72 splits in one
//                     round of loads, one CTA per SM) when the call's rows fit one wave of it,
//                     else the narrow one (32 splits per round, two CTAs per SM).
// On sm_90 and up (sm_120 included) attention and combine are programmatic dependent launches:
// each may start while its predecessor drains and waits for it before reading its output.
//
// Warp layout of the attention kernel (8 warps, all 32 rows in every warp: two m16 MMA tiles):
//   S = Q K^T   warp w computes the 16-token half w / 4 of the tile over the 144-dim quarter w % 4,
//               with its Q fragments (32 rows x 144 dims) held in registers; each K fragment feeds
//               4 MMAs. The 4 partial tiles of a half are reduced through shared memory, each warp
//               summing one 16 x 8 piece (its own share of it from registers), which it turns into
//               P and stores once as bf16/fp16.
//   O += P V    warp w owns V columns 64w..64w+63 for all 32 rows (64 fp32 accumulators), reading
//               P from shared memory; each V fragment feeds 4 MMAs.
// The online softmax is lazy: the running max moves (and O is rescaled) only when a score exceeds
// it by more than 2^8, decided CTA-wide on the barrier that publishes P. See bench/README.md for
// the measurements behind each choice.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "mma_sm80.h"
#include "verify_config.h"
#include "verify_params.h"

namespace kdtree {
namespace {

constexpr float kLn2 = 0.6931471805599453f;

// How the kernel of an fp8 pool rounds (docs/kernel-fp8.md): fp16 operands (the default kernel),
// SGLang's Triton roundings, or the pass before those that writes each split's row maxima.
enum class Fp8Numerics { kFp16Operands, kTriton, kTritonRowMax };

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

// 16-byte async copy; src_bytes = 0 zero-fills the destination (used for tokens past the end so
// that no stale shared memory, possibly NaN, reaches the P*V MMA).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
// 16 bytes from registers into shared memory (rows converted on chip).
__device__ __forceinline__ void st_shared_16(uint32_t dst, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
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
// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Programmatic dependent launch (sm_90+, which includes sm_120): the attention kernel lets the
// combine kernel launch early, and the combine kernel waits for the attention grid's completion
// (and its memory) only before it reads the partials; the attention kernel itself waits for its
// predecessor before its first read. Compiled out for sm_80, where the host launches plainly.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ uint32_t load_u32(const void* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// ---------------------------------------------------------------------------------------------
// Plan: one CTA of 256 threads, each owning a contiguous run of requests. Pass 1 counts row
// tiles / mask sizes / work per thread; a warp-shuffle scan plus one pass over the 8 warp totals
// turns counts into offsets (a single __syncthreads); pass 2 writes the row-tile table with
// all threads. The KV split size ("chunk") is uniform over the batch: total work / target CTAs, at
// least ceil(max_len / max_splits), rounded to kBlockN, then raised until the CTAs fit one wave
// (one_wave_chunk: one barrier per bisection step). Latency matters more than width here: the
// whole kernel is a few dependent global round trips. Each row tile gets a TileMeta carrying its
// request's RequestMeta, so attention and combine CTAs read their schedule in one load.
constexpr int kPlanWarps = kPlanThreads / 32;

__device__ __forceinline__ int64_t warp_inclusive_scan(int64_t v, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int64_t o = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += o;
  }
  return v;
}

// Draft tokens n and prefix L of request b.
__device__ __forceinline__ void request_shape(const VerifyParams& p, int b, int64_t& n,
                                              int64_t& L) {
  n = load_index(p.qo_indptr, p.qo_indptr_64, b + 1) - load_index(p.qo_indptr, p.qo_indptr_64, b);
  L = load_index(p.kv_indptr, p.kv_indptr_64, b + 1) - load_index(p.kv_indptr, p.kv_indptr_64, b);
  n = n < 0 ? 0 : n;  // malformed indptr: treat as empty rather than corrupt memory
  L = L < 0 ? 0 : L;
}

// Splits of a virtual sequence of `len` tokens (< 2^31, like every token position here). 32-bit
// division: a 64-bit one is a called subroutine, and its register saves spill.
__device__ __forceinline__ int32_t splits_of(int64_t len, int64_t chunk) {
  const uint32_t c = static_cast<uint32_t>(chunk);
  return static_cast<int32_t>((static_cast<uint32_t>(len) + c - 1) / c);
}

// Attention CTAs (row tiles x splits) of the whole batch at split size `chunk`, summed over the
// block; every thread passes its own requests [b_begin, b_end). `parity` picks one of two
// shared-memory buffers, so consecutive calls need one barrier each.
__device__ __forceinline__ int64_t count_ctas(const VerifyParams& p, int64_t chunk, int b_begin,
                                              int b_end, int parity) {
  __shared__ int64_t s_count[2][kPlanWarps];
  int64_t ctas = 0;
  for (int b = b_begin; b < b_end; ++b) {
    int64_t n, L;
    request_shape(p, b, n, L);
    ctas += (n * p.num_heads + kBlockM - 1) / kBlockM * splits_of(L + n, chunk);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ctas += __shfl_xor_sync(0xffffffffu, ctas, off);
  if ((threadIdx.x & 31) == 0) s_count[parity][threadIdx.x >> 5] = ctas;
  __syncthreads();
  int64_t total = 0;
#pragma unroll
  for (int i = 0; i < kPlanWarps; ++i) total += s_count[parity][i];
  return total;
}

// The split size that keeps the grid to one wave. ceil(len / chunk) adds up to one split per row
// tile to the work-proportional estimate `chunk`, and the CTAs beyond the target would run as a
// second wave behind full-length ones (B=8, H=8, T=8, 4k: 144 CTAs for 132 SMs, the last 16
// holding only the 8 draft tokens each). So take the smallest multiple of kBlockN at or above
// `chunk` whose CTA count fits the target, by bisection on the block-wide count. Where one split
// per row tile already exceeds the target, no split size helps and `chunk` stays.
// kdtree_verify.plan.split_chunk is the same rule on the host.
__device__ __forceinline__ int64_t one_wave_chunk(const VerifyParams& p, int64_t chunk,
                                                  int64_t target, int64_t total_tiles,
                                                  int64_t total_work, int64_t max_len, int b_begin,
                                                  int b_end) {
  if (total_tiles == 0 || total_tiles > target) return chunk;
  int parity = 0;
  if (count_ctas(p, chunk, b_begin, b_end, parity ^= 1) <= target) return chunk;
  // At hi every request fits in one split (total_tiles <= target CTAs), or hi is the size that
  // bounds the count by total_work / hi + total_tiles <= target.
  int64_t hi = (max_len + kBlockN - 1) / kBlockN * kBlockN;
  if (target > total_tiles) {
    const int64_t bound = (total_work + target - total_tiles - 1) / (target - total_tiles);
    const int64_t bound_up = (bound + kBlockN - 1) / kBlockN * kBlockN;
    hi = bound_up < hi ? bound_up : hi;
  }
  int64_t lo = chunk;  // count(lo) > target >= count(hi)
  while (hi - lo > kBlockN) {
    const int64_t mid = (lo + hi) / 2 / kBlockN * kBlockN;
    if (count_ctas(p, mid, b_begin, b_end, parity ^= 1) <= target) hi = mid;
    else lo = mid;
  }
  return hi;
}

__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const VerifyParams p) {
  __shared__ int64_t s_tiles[kPlanWarps], s_mask[kPlanWarps], s_work[kPlanWarps];
  __shared__ int64_t s_maxlen[kPlanWarps];
  // Pass 2: one request per thread and round, and the round's tile offsets.
  __shared__ RequestMeta s_req_meta[kPlanThreads];
  __shared__ int64_t s_req_first[kPlanThreads], s_round_start[kPlanThreads];
  __shared__ int64_t s_round_warp[kPlanWarps];
  __shared__ int32_t s_req_index[kPlanThreads];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int B = p.batch;
  const int H = p.num_heads;
  const int per = (B + kPlanThreads - 1) / kPlanThreads;
  const int b_begin = min(B, tid * per);
  const int b_end = min(B, b_begin + per);

  int64_t my_tiles = 0, my_mask = 0, my_work = 0, my_maxlen = 0;
  for (int b = b_begin; b < b_end; ++b) {
    int64_t n, L;
    request_shape(p, b, n, L);
    const int64_t tiles = (n * H + kBlockM - 1) / kBlockM;
    const int64_t len = L + n;
    my_tiles += tiles;
    my_mask += n * len;
    my_work += tiles * len;
    if (tiles > 0 && len > my_maxlen) my_maxlen = len;
  }
  const int64_t tiles_incl = warp_inclusive_scan(my_tiles, lane);
  const int64_t mask_incl = warp_inclusive_scan(my_mask, lane);
  int64_t w = my_work, mx = my_maxlen;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    w += __shfl_xor_sync(0xffffffffu, w, off);
    const int64_t o = __shfl_xor_sync(0xffffffffu, mx, off);
    mx = o > mx ? o : mx;
  }
  if (lane == 31) {
    s_tiles[warp] = tiles_incl;
    s_mask[warp] = mask_incl;
  }
  if (lane == 0) {
    s_work[warp] = w;
    s_maxlen[warp] = mx;
  }
  __syncthreads();
  int64_t tile_pos = tiles_incl - my_tiles, mask_pos = mask_incl - my_mask;
  int64_t total_tiles = 0, total_work = 0, max_len = 0;
#pragma unroll
  for (int i = 0; i < kPlanWarps; ++i) {
    if (i < warp) {
      tile_pos += s_tiles[i];
      mask_pos += s_mask[i];
    }
    total_tiles += s_tiles[i];
    total_work += s_work[i];
    max_len = s_maxlen[i] > max_len ? s_maxlen[i] : max_len;
  }
  const int64_t target = p.target_ctas > 0 ? p.target_ctas : 1;
  int64_t chunk = (total_work + target - 1) / target;
  const int64_t by_cap = (max_len + p.max_splits - 1) / p.max_splits;
  chunk = chunk > by_cap ? chunk : by_cap;
  chunk = chunk > kChunkMinTokens ? chunk : kChunkMinTokens;
  chunk = (chunk + kBlockN - 1) / kBlockN * kBlockN;
  chunk = one_wave_chunk(p, chunk, target, total_tiles, total_work, max_len, b_begin, b_end);
  if (tid == 0) *p.chunk = static_cast<int32_t>(chunk);
  // Pass 2, in rounds: round k publishes every thread's k-th request (its RequestMeta, table
  // position and tile count) to shared memory, a block scan of the tile counts numbers the
  // round's tiles, and all 256 threads write them (entry e finds its request by a binary search
  // over the round's offsets). A batch of small requests costs about one store per thread, and a
  // request of 128 row tiles no longer costs 128 serial stores by its owner.
  for (int k = 0; k < per; ++k) {  // `per` is uniform: every thread runs every round
    const int b = b_begin + k;
    int64_t tiles = 0;
    RequestMeta m{};
    if (b < b_end) {
      int64_t n, L;
      request_shape(p, b, n, L);
      tiles = (n * H + kBlockM - 1) / kBlockM;
      const int64_t len = L + n;
      m.kv_start = load_index(p.kv_indptr, p.kv_indptr_64, b);
      m.mask_start =
          p.mask_indptr != nullptr ? load_index(p.mask_indptr, p.mask_indptr_64, b) : mask_pos;
      m.qo_start = static_cast<int32_t>(load_index(p.qo_indptr, p.qo_indptr_64, b));
      m.num_q = static_cast<int32_t>(n);
      m.prefix_len = static_cast<int32_t>(L);
      m.num_splits = tiles > 0 ? splits_of(len, chunk) : 0;
      mask_pos += n * len;
    }
    s_req_meta[tid] = m;
    s_req_first[tid] = tile_pos;
    s_req_index[tid] = b;
    tile_pos += tiles;
    const int64_t round_incl = warp_inclusive_scan(tiles, lane);
    if (lane == 31) s_round_warp[warp] = round_incl;
    __syncthreads();
    int64_t round_start = round_incl - tiles, round_total = 0;
#pragma unroll
    for (int i = 0; i < kPlanWarps; ++i) {
      if (i < warp) round_start += s_round_warp[i];
      round_total += s_round_warp[i];
    }
    s_round_start[tid] = round_start;
    __syncthreads();
    for (int64_t e = tid; e < round_total; e += kPlanThreads) {
      // The last thread whose round offset is <= e owns entry e (threads without tiles share
      // their successor's offset, so the search passes over them).
      int lo = 0, hi = kPlanThreads;
      while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (s_round_start[mid] <= e) lo = mid;
        else hi = mid;
      }
      const int64_t row_tile = e - s_round_start[lo];
      const int64_t pos = s_req_first[lo] + row_tile;
      if (pos < p.num_tile_slots)  // the host bound makes this always true
        p.tiles[pos] = TileMeta{s_req_meta[lo], s_req_index[lo], static_cast<int32_t>(row_tile), 0};
    }
    __syncthreads();  // the next round overwrites this round's shared entries
  }
  for (int64_t i = total_tiles + tid; i < p.num_tile_slots; i += kPlanThreads)
    p.tiles[i] = TileMeta{RequestMeta{}, -1, 0, 0};
}

// ---------------------------------------------------------------------------------------------
// Byte offset of 16-byte chunk `chunk` of KV row `row` inside a stage (XOR swizzle, see config).
__device__ __forceinline__ uint32_t kv_offset(int row, int chunk) {
  return row * kKvRowBytes + ((chunk ^ (row & 7)) << 4);
}
// Byte offset of 16-byte chunk `chunk` (4 per row) of P row `row`: rows are 64 B, so the chunk is
// XOR-swizzled with (row / 2) & 3 to spread the 8 rows of an ldmatrix over 8 bank groups.
__device__ __forceinline__ uint32_t p_offset(int row, int chunk) {
  return row * (kBlockN * 2) + ((chunk ^ ((row >> 1) & 3)) << 4);
}

// Work of one CTA: KV tokens [kv_begin, kv_end) of request `meta`'s virtual sequence for its
// 32 rows (row tile `mt`). Warp roles (see verify_config.h):
//   S phase   warp (half, quarter): S[32 rows, 16 tokens of its half] over its 144 dims;
//             then piece (quarter / 2 = m-tile, quarter % 2 = n8 tile) of its half is reduced
//             over the 4 quarters, turned into P and written to shared memory as bf16/fp16.
//   PV phase  warp w: O[32 rows, V columns 64w..64w+63] += P V.
// Softmax statistics: every thread keeps the running max m_run of its 4 O rows (identical in all
// warps: they are updated only from the shared per-piece maxima, in the same order), and the
// running sum l_run of the 2 rows of its piece (summed over the pieces in the epilogue).
//
// kFp8Kv: the pool holds float8_e4m3fn and the MMAs run in fp16 (Mma below) whatever q's dtype:
// e4m3 -> fp16 is one conversion per pair (cvt.rn.f16x2.e4m3x2), where bf16 would take three
// conversion-pipe instructions per pair through fp32, and that pipe is what bound the fp8 path.
// Pool rows are read into registers (8 bytes per copy, the same chunk mapping as the cp.async
// path) at the top of an iteration and dequantized into the free stage at its end, so shared
// memory and the softmax are the bf16 kernel's. Q and the draft rows (k_extend, Elem) are rounded
// to fp16 on the way in (bf16x2_to_f16x2: exact for magnitudes 2^-14 to 65504). Prefix scores
// take k_scale, and prefix P values take v_scale before they are rounded for the P V MMA (the row
// sums do not).
//
// Fp8Numerics::kTriton (an fp8 pool with p.fp8_triton) computes what SGLang's Triton fp8 path
// computes: q rounded to e4m3, the running max moved on every tile (P <= 1), the prefix's P rounded
// to e4m3 and the draft's to bf16 before the P V MMA, and each split starting from the running max
// of every token before it, which the kTritonRowMax pass (the same kernel up to the scores) writes
// per split into p.row_max first. The operands stay fp16 (every e4m3 value is one, and the products
// are exact either way), so only the roundings differ from kFp16Operands.
template <typename Elem, bool kFp8Kv, Fp8Numerics kNum>
__global__ void __launch_bounds__(kThreads, 1) attention_kernel(const VerifyParams p) {
  static_assert(kFp8Kv || kNum == Fp8Numerics::kFp16Operands, "Triton numerics need an fp8 pool");
  constexpr bool kTriton = kNum != Fp8Numerics::kFp16Operands;
  constexpr bool kRowMaxPass = kNum == Fp8Numerics::kTritonRowMax;
  constexpr int kLoadThreadsPerRow = kThreads / kBlockN;
  constexpr int kKLoads = kKvRowChunks / kLoadThreadsPerRow;  // 16-byte copies per thread
  constexpr int kVLoads = (kHeadDimV / 8) / kLoadThreadsPerRow;
  constexpr int kKSteps = kQkSlice / 16;
  constexpr int kVTiles = kVSlice / 8;
  static_assert(kThreads % kBlockN == 0 && kBlockN % 16 == 0, "loader / MMA tiling");
  static_assert(kKvRowChunks % kLoadThreadsPerRow == 0 && kLoadThreadsPerRow == 8,
                "each loader thread copies whole chunks at a constant swizzled stride");
  extern __shared__ __align__(128) uint8_t smem[];
  // Launched as a programmatic dependent of whatever ran before on the stream (sm_90+): the CTAs
  // start while it finishes, and wait for it (and its memory) before reading any input, the
  // plan's output included.
  wait_for_prerequisite_grid();
  // The combine grid launches once every attention CTA has passed this point or exited, i.e. when
  // no attention CTA still waits for an SM; its CTAs read their metadata, then wait for this grid.
  allow_dependent_launch();
  const int slot = blockIdx.x;
  const int split = blockIdx.y;
  const TileMeta tile = p.tiles[slot];
  if (tile.request < 0) return;
  const RequestMeta meta = tile.req;
  if (split >= meta.num_splits) return;
  // No split reads the last split's maxima.
  if (kRowMaxPass && split == meta.num_splits - 1) return;
  const int mt = tile.row_tile;
  const int chunk = *p.chunk;
  const int L = meta.prefix_len;
  const int len = L + meta.num_q;
  const int kv_begin = split * chunk;
  const int kv_end = min(len, kv_begin + chunk);
  const int n_tiles = (kv_end - kv_begin + kBlockN - 1) / kBlockN;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int half = warp / kDimSplits;
  const int quarter = warp % kDimSplits;
  const int piece_mi = quarter >> 1;  // m-tile of this warp's S piece
  const int piece_nt = quarter & 1;   // n8 tile (within the token half) of the piece
  const int H = p.num_heads;
  const int rows = meta.num_q * H;

  // The 4 rows this thread holds in the MMA fragment layouts: r = mi * 2 + h is row
  // mi * 16 + lane / 4 + 8 h. Its piece rows are r = piece_mi * 2 + {0, 1}.
  int row_t[4], row_h[4];
  bool row_valid[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int m = mt * kBlockM + (r >> 1) * 16 + (lane >> 2) + 8 * (r & 1);
    row_valid[r] = m < rows;
    row_t[r] = row_valid[r] ? m / H : 0;
    row_h[r] = row_valid[r] ? m % H : 0;
  }

  // Loader mapping: 8 threads per KV row; thread `ld_sub` copies chunks ld_sub + 8 i. Because
  // the swizzle only permutes the low 3 bits of the chunk index, those copies land at a constant
  // 128-byte stride from one swizzled base, so the copy loop needs no per-chunk address math.
  const int ld_row = tid / kLoadThreadsPerRow;
  const int ld_sub = tid % kLoadThreadsPerRow;
  const uint32_t ld_dst = kv_offset(ld_row, ld_sub);
  // Pool rows in elements of the pool's type (one byte for fp8), draft rows in Elem.
  using KvElem = std::conditional_t<kFp8Kv, uint8_t, Elem>;
  // The MMA operand type, and whether Elem rows (Q, draft rows) must be converted to it.
  using Mma = std::conditional_t<kFp8Kv, __half, Elem>;
  constexpr bool kConvertRows = !std::is_same_v<Mma, Elem>;
  const KvElem* k_buf = reinterpret_cast<const KvElem*>(p.k_buf);
  const KvElem* v_buf = reinterpret_cast<const KvElem*>(p.v_buf);
  const Elem* k_ext = reinterpret_cast<const Elem*>(p.k_ext);
  const Elem* v_ext = reinterpret_cast<const Elem*>(p.v_ext);
  struct Src {
    const void* k;
    const void* v;
    bool valid;
    bool pooled;  // a prefix row (k_buffer), else a draft row (k_extend) or none
  };
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint8_t* idx_ring = smem + kIdxRingOffset;
  const uint32_t idx_ring_smem = smem_base + kIdxRingOffset;
  // Source rows of this thread's KV row in `tile`; the prefix index comes from the ring
  // (from_ring) or straight from global memory (pipeline prologue and the separate-V path).
  auto resolve = [&](int tile, bool from_ring) -> Src {
    const int j = kv_begin + tile * kBlockN + ld_row;
    Src s{k_buf, v_buf, false, false};
    if (tile < n_tiles && j < kv_end) {
      s.valid = true;
      if (j < L) {
        s.pooled = true;
        int64_t idx;
        if (from_ring) {
          const uint8_t* ring_slot = idx_ring + (tile % kIdxRing) * kIdxSlotBytes;
          idx = p.kv_indices_64 ? reinterpret_cast<const int64_t*>(ring_slot)[ld_row]
                                : reinterpret_cast<const int32_t*>(ring_slot)[ld_row];
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
  // Rows in Elem (Q, draft rows, a bf16/fp16 pool, zero fill): cp.async straight into the stage.
  auto issue_k = [&](int stage, const Src& s) {
    const uint32_t dst = smem_base + stage * kKvStageBytes + ld_dst;
    const Elem* src = static_cast<const Elem*>(s.k) + ld_sub * 8;
#pragma unroll
    for (int i = 0; i < kKLoads; ++i) cp_async_16(dst + i * 128, src + i * 64, s.valid ? 16 : 0);
  };
  // Elem rows into an fp16 stage (bf16 q with an fp8 pool: the draft rows): loaded, converted
  // and stored at once. Only the draft block's tiles take this path.
  auto copy_converted = [&](int stage, const void* row, int n_loads) {
    const uint32_t dst = smem_base + stage * kKvStageBytes + ld_dst;
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const Elem*>(row) + ld_sub * 8);
#pragma unroll
    for (int i = 0; i < n_loads; ++i) {
      const uint4 e = __ldg(src + i * 8);
      st_shared_16(dst + i * 128, make_uint4(bf16x2_to_f16x2(e.x), bf16x2_to_f16x2(e.y),
                                             bf16x2_to_f16x2(e.z), bf16x2_to_f16x2(e.w)));
    }
  };
  auto issue_v = [&](int stage, const Src& s) {
    if (kFp8Kv && s.pooled) return;  // an fp8 pool's V is its K rows' first 512 columns
    if (kConvertRows && s.valid) return copy_converted(stage, s.v, kVLoads);
    const uint32_t dst = smem_base + stage * kKvStageBytes + ld_dst;
    const Elem* src = static_cast<const Elem*>(s.v) + ld_sub * 8;
#pragma unroll
    for (int i = 0; i < kVLoads; ++i) cp_async_16(dst + i * 128, src + i * 64, s.valid ? 16 : 0);
  };
  // fp8 pool rows: this thread's 9 8-byte pieces (Elem chunks ld_sub + 8 i once dequantized) are
  // loaded into registers by fetch_kv and written to the stage by store_kv. On sm_80, whose
  // software conversion needs more registers than the 18 pieces leave, fetch_kv stores at once
  // (the loads' latency is then not hidden behind the tile's compute).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  constexpr bool kHoldAcrossTile = false;
#else
  constexpr bool kHoldAcrossTile = true;
#endif
  uint2 kv8[kFp8Kv ? kKLoads : 1];
  bool kv8_held = false;
  auto store_kv = [&](int stage) {
    if constexpr (kFp8Kv) {
      if (!kv8_held) return;
      const uint32_t dst = smem_base + stage * kKvStageBytes + ld_dst;
#pragma unroll
      for (int i = 0; i < kKLoads; ++i) {
        uint4 e;
        fp8x4_to_elem2x2<Mma>(kv8[i].x, e.x, e.y);
        fp8x4_to_elem2x2<Mma>(kv8[i].y, e.z, e.w);
        st_shared_16(dst + i * 128, e);
      }
      kv8_held = false;
    }
  };
  auto fetch_kv = [&](int stage, const Src& s) {
    if constexpr (kFp8Kv) {
      kv8_held = s.valid && s.pooled;
      if (kv8_held) {
        const uint2* src = static_cast<const uint2*>(s.k) + ld_sub;
#pragma unroll
        for (int i = 0; i < kKLoads; ++i) kv8[i] = __ldg(src + i * 8);
        if (!kHoldAcrossTile) store_kv(stage);
        return;
      }
    }
    if (kConvertRows && s.valid) return copy_converted(stage, s.k, kKLoads);
    issue_k(stage, s);
  };

  // Prologue: KV tile 0 (indices read directly) and the indices of tile 1 form the first
  // cp.async group; iteration `it` then issues KV tile it + 1 (its indices landed with the group
  // waited on at the top of the iteration) and the indices of tile it + 2.
  static_assert(kStages == 2, "the pipeline below prefetches exactly one tile ahead");
  fetch_kv(0, resolve(0, false));
  store_kv(0);  // (fp8: waits for this tile's loads once, in the prologue)
  issue_idx(1);
  // Q's 32 rows go through stage 1 (free until iteration 0 loads tile 1), laid out like a KV tile:
  // 9 16-byte copies per thread, then ldmatrix. Read straight into the MMA fragment layout, Q
  // takes 72 scattered 4-byte loads per thread, which land no sooner than the first KV tile
  // (run 51, docs/kernel-journal.md). Rows that are not 16-byte aligned take that path still.
  const Elem* q = reinterpret_cast<const Elem*>(p.q);
  if (p.q_rows_16b) {
    const int m = mt * kBlockM + ld_row;
    const bool valid = m < rows;
    const Elem* qrow = valid ? q + static_cast<int64_t>(meta.qo_start + m / H) * p.q_stride_tok +
                                   static_cast<int64_t>(m % H) * p.q_stride_head
                             : q;
    issue_k(1, Src{qrow, qrow, valid});
  }
  cp_async_commit();

  // Q fragments (A operand: 32 rows x this warp's 144 columns).
  uint32_t qf[kMTiles][kKSteps][4];
  if (p.q_rows_16b) {
    cp_async_wait<0>();
    __syncthreads();  // every thread's Q copies have landed
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk)
        ldmatrix_x4(qf[mi][kk], smem_base + kKvStageBytes +
                                    kv_offset(mi * 16 + (lane & 15),
                                              (quarter * kQkSlice + kk * 16) / 8 + (lane >> 4)));
    // (iteration 0's barrier orders these reads before tile 1's copies into stage 1)
  }
  // Q straight from global memory into the fragment layout, converted to the MMA type.
  auto load_q_fragments = [&]() {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
      const Elem* qrow[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = mi * 2 + h;
        qrow[h] = q + static_cast<int64_t>(meta.qo_start + row_t[r]) * p.q_stride_tok +
                  static_cast<int64_t>(row_h[r]) * p.q_stride_head;
      }
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        const int d = quarter * kQkSlice + kk * 16 + (lane & 3) * 2;
        qf[mi][kk][0] = row_valid[mi * 2] ? load_u32(qrow[0] + d) : 0u;
        qf[mi][kk][1] = row_valid[mi * 2 + 1] ? load_u32(qrow[1] + d) : 0u;
        qf[mi][kk][2] = row_valid[mi * 2] ? load_u32(qrow[0] + d + 8) : 0u;
        qf[mi][kk][3] = row_valid[mi * 2 + 1] ? load_u32(qrow[1] + d + 8) : 0u;
      }
    }
  };
  auto convert_q_fragments = [&]() {
    if constexpr (kConvertRows) {
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
          for (int e = 0; e < 4; ++e) qf[mi][kk][e] = bf16x2_to_f16x2(qf[mi][kk][e]);
    }
  };
  if (!p.q_rows_16b) load_q_fragments();
  convert_q_fragments();
  // kTriton: the prefix's scores take q.to(k.dtype), exact in fp16 once rounded; the draft's take
  // q as it is (Triton's second stage), so the fragments are loaded again at the first tile that
  // holds draft tokens.
  bool q_rounded = kTriton;
  if constexpr (kTriton) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) qf[mi][kk][e] = f16x2_round_e4m3(qf[mi][kk][e]);
  }

  float4* xch = reinterpret_cast<float4*>(smem + kXchOffset);
  const uint32_t p_smem = smem_base + kPOffset;
  float* row_stat = reinterpret_cast<float*>(smem + kRowStatOffset);  // [kBlockM][kPiecesPerRow]
  const int piece = half * 2 + piece_nt;                              // this warp's stat column
  // The piece's rows (r = piece_mi * 2 + h), selected without runtime array indexing (which
  // would put the arrays in local memory).
  auto piece_of = [&](const auto(&v)[4], int h) { return piece_mi ? v[2 + h] : v[h]; };
  int piece_row_t[2];
  bool piece_row_valid[2];
  const uint8_t* mask_row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    piece_row_t[h] = piece_of(row_t, h);
    piece_row_valid[h] = piece_of(row_valid, h);
    mask_row[h] = p.mask != nullptr
                      ? p.mask + meta.mask_start + static_cast<int64_t>(piece_row_t[h]) * len
                      : nullptr;
  }

  float o[kMTiles][kVTiles][4];
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int nt = 0; nt < kVTiles; ++nt)
      o[mi][nt][0] = o[mi][nt][1] = o[mi][nt][2] = o[mi][nt][3] = 0.f;
  float m_run[4] = {neg_inf(), neg_inf(), neg_inf(), neg_inf()};  // log2 domain, scaled scores
  float l_run[2] = {0.f, 0.f};                                    // piece rows, this thread's share
  if constexpr (kNum == Fp8Numerics::kTriton) {
    if (split > 0) {
      // Start from the running max of every earlier split (the kTritonRowMax pass's), so that P
      // is taken against the max of every token before it, as Triton's sequential loop takes it.
      // The exchange area is free until the main loop.
      float* scratch = reinterpret_cast<float*>(smem + kXchOffset);
      constexpr int kParts = kThreads / kBlockM;
      const int row = tid % kBlockM, part = tid / kBlockM;
      float mx = neg_inf();
      for (int s2 = part; s2 < split; s2 += kParts)
        mx = fmaxf(mx,
                   p.row_max[(static_cast<int64_t>(s2) * p.num_tile_slots + slot) * kBlockM + row]);
      scratch[part * kBlockM + row] = mx;
      __syncthreads();
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row_local = (r >> 1) * 16 + (lane >> 2) + 8 * (r & 1);
#pragma unroll
        for (int k = 0; k < kParts; ++k)
          m_run[r] = fmaxf(m_run[r], scratch[k * kBlockM + row_local]);
      }
    }
  }
  float row_max_seen[2] = {neg_inf(), neg_inf()};  // kTritonRowMax: piece rows, this thread's share
  // > 0 (validated), so max(s) * scale = max(s * scale). The fp8 pool's scores are scaled per
  // column as they are unmasked (below).
  const float scale = kFp8Kv ? 1.f : p.scale_log2;

  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it & 1;
    cp_async_wait<0>();  // tile `it` and the indices of it + 1 have landed (this thread's copies)
    __syncthreads();     // ... everyone's; and everyone is done with tile it - 1 (stage, P)
    if (it + 1 < n_tiles) fetch_kv(stage ^ 1, resolve(it + 1, true));
    issue_idx(it + 2);
    cp_async_commit();

    const uint32_t kv_smem = smem_base + stage * kKvStageBytes;
    // ---- partial S[32 rows, 16 tokens of this half] over this warp's 144 columns: 4
    // independent accumulator chains; each K fragment feeds both m-tiles.
    float s[kMTiles][2][4];
    auto score_tile = [&](float (&acc)[kMTiles][2][4]) {
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int n = 0; n < 2; ++n)
          acc[mi][n][0] = acc[mi][n][1] = acc[mi][n][2] = acc[mi][n][3] = 0.f;
      const int tok = half * kHalfN + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        const int c = (quarter * kQkSlice + kk * 16) / 8 + ((lane >> 3) & 1);
        uint32_t r[4];
        ldmatrix_x4(r, kv_smem + kv_offset(tok, c));
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          ElemOps<Mma>::mma(acc[mi][0], qf[mi][kk], r[0], r[1]);
          ElemOps<Mma>::mma(acc[mi][1], qf[mi][kk], r[2], r[3]);
        }
      }
    };
    score_tile(s);
    if constexpr (kTriton) {
      const int first_token = kv_begin + it * kBlockN;
      if (q_rounded && min(first_token + kBlockN, kv_end) > L) {
        // The first tile with draft tokens: its prefix columns keep the rounded q's scores, the
        // draft columns (and every later tile) take q itself.
        float prefix_s[kMTiles][2][4];
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) prefix_s[mi][n][e] = s[mi][n][e];
        load_q_fragments();
        convert_q_fragments();
        q_rounded = false;
        score_tile(s);
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (first_token + half * kHalfN + n * 8 + (lane & 3) * 2 + (e & 1) < L)
                s[mi][n][e] = prefix_s[mi][n][e];
      }
    }
    // ---- reduce this warp's piece over the 4 quarters of its half (own share first, then the
    // others in quarter order). The own share (sub-tile `quarter`) stays in registers: only the
    // other three sub-tiles go through shared memory (a quarter less exchange traffic).
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int n = 0; n < 2; ++n)
        if (mi * 2 + n != quarter)
          xch[((warp * kMTiles + mi) * 2 + n) * 32 + lane] =
              make_float4(s[mi][n][0], s[mi][n][1], s[mi][n][2], s[mi][n][3]);
    // (selected without runtime array indexing, which would put s in local memory)
    const auto own_element = [&](int e) {
      return quarter == 0   ? s[0][0][e]
             : quarter == 1 ? s[0][1][e]
             : quarter == 2 ? s[1][0][e]
                            : s[1][1][e];
    };
    const float4 own = make_float4(own_element(0), own_element(1), own_element(2), own_element(3));
    named_barrier(1 + half, kDimSplits * 32);
    float sp[4];
    {
      float4 acc = own;
#pragma unroll
      for (int w = 0; w < kDimSplits; ++w) {
        if (w == quarter) continue;
        const float4 v =
            xch[(((half * kDimSplits + w) * kMTiles + piece_mi) * 2 + piece_nt) * 32 + lane];
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
      }
      sp[0] = acc.x;
      sp[1] = acc.y;
      sp[2] = acc.z;
      sp[3] = acc.w;
    }

    // ---- mask the piece: prefix columns are all visible; draft columns follow the tree mask
    // (or causal order); columns past this split's end are invisible. Only the tiles at the end
    // of a split or in the draft block need it.
    const int tile_start = kv_begin + it * kBlockN;
    const int piece_col = tile_start + half * kHalfN + piece_nt * 8 + (lane & 3) * 2;
    if (tile_start + kBlockN > min(L, kv_end)) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = piece_col + (e & 1);
        const int h = e >> 1;
        bool visible;
        if (j >= kv_end) {
          visible = false;
        } else if (j < L || !piece_row_valid[h]) {
          visible = true;
        } else if (mask_row[h] != nullptr) {
          visible = mask_row[h][j] != 0;
        } else {
          visible = (j - L) <= piece_row_t[h];
        }
        if (!visible) sp[e] = neg_inf();
      }
    }
    // fp8 pool: scale the scores here (prefix columns also by k_scale), so `scale` below is 1;
    // vf is the factor of each P value in the P V product (v_scale for prefix columns).
    float vf[4] = {1.f, 1.f, 1.f, 1.f};
    bool prefix_col[4] = {true, true, true, true};
    if constexpr (kFp8Kv) {
      const float prefix_scale = p.scale_log2 * p.k_scale;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        prefix_col[e] = piece_col + (e & 1) < L;
        sp[e] *= prefix_col[e] ? prefix_scale : p.scale_log2;
        vf[e] = prefix_col[e] ? p.v_scale : 1.f;
      }
    }
    if constexpr (kRowMaxPass) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        row_max_seen[h] = fmaxf(row_max_seen[h], fmaxf(sp[2 * h], sp[2 * h + 1]));
      store_kv(stage ^ 1);
      continue;
    }

    // ---- P against the running max. The max is lazy: it only moves (and O and l are only
    // rescaled) when some score of the CTA's tile exceeds it by more than 2^kRescaleLog2; the
    // vote rides on the barrier that publishes P. (kTriton: it moves on every tile.)
    bool grow = kTriton;
    float pv[4];
    auto compute_p = [&]() {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m = piece_of(m_run, h);
        const float m_use = m == neg_inf() ? 0.f : m;  // a fully masked row so far
        pv[2 * h] = fast_exp2(fmaf(sp[2 * h], scale, -m_use));
        pv[2 * h + 1] = fast_exp2(fmaf(sp[2 * h + 1], scale, -m_use));
      }
    };
    // The P V operand: P times v_scale (fp8 prefix columns); kTriton rounds P as Triton does.
    auto p_operand = [&](int e) -> float {
      if constexpr (kTriton)
        // (the draft's P to q's dtype: bf16 here; fp16 q is rounded by the fp16 pack itself)
        return prefix_col[e] ? round_e4m3(pv[e]) * vf[e]
                             : (ElemOps<Elem>::kBF16 ? round_bf16(pv[e]) : pv[e]);
      else return pv[e] * vf[e];
    };
    auto store_p = [&]() {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = piece_mi * 16 + (lane >> 2) + 8 * h;
        const int col = half * kHalfN + piece_nt * 8 + (lane & 3) * 2;  // token in the tile
        const uint32_t addr = p_smem + p_offset(row, col / 8) + (col % 8) * 2;
        const uint32_t packed = kFp8Kv ? ElemOps<Mma>::pack(p_operand(2 * h), p_operand(2 * h + 1))
                                       : ElemOps<Mma>::pack(pv[2 * h], pv[2 * h + 1]);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(packed) : "memory");
      }
    };
    if constexpr (!kTriton) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float limit = piece_of(m_run, h) + kRescaleLog2;
        grow |= fmaxf(sp[2 * h], sp[2 * h + 1]) * scale > limit;
      }
      compute_p();
      store_p();
    }
    if (__syncthreads_or(grow)) {
      // Rare (the first tile of a CTA, then only when scores jump): publish the piece row maxima,
      // move every row's max to the tile's, rescale O and l, and redo P.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = fmaxf(sp[2 * h], sp[2 * h + 1]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if ((lane & 3) == 0)
          row_stat[(piece_mi * 16 + (lane >> 2) + 8 * h) * kPiecesPerRow + piece] = mx * scale;
      }
      __syncthreads();
      float alpha[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float* stat = row_stat + ((r >> 1) * 16 + (lane >> 2) + 8 * (r & 1)) * kPiecesPerRow;
        float m_new = m_run[r];
#pragma unroll
        for (int k = 0; k < kPiecesPerRow; ++k) m_new = fmaxf(m_new, stat[k]);
        alpha[r] = m_new == neg_inf() ? 1.f : fast_exp2(m_run[r] - m_new);
        m_run[r] = m_new;
      }
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int nt = 0; nt < kVTiles; ++nt) {
          o[mi][nt][0] *= alpha[mi * 2];
          o[mi][nt][1] *= alpha[mi * 2];
          o[mi][nt][2] *= alpha[mi * 2 + 1];
          o[mi][nt][3] *= alpha[mi * 2 + 1];
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) l_run[h] *= piece_of(alpha, h);
      compute_p();
      store_p();
      __syncthreads();  // the new P is visible; row_stat may be rewritten next time
    }
    l_run[0] += pv[0] + pv[1];
    l_run[1] += pv[2] + pv[3];

    // ---- V rows that are not the first 512 columns of the K rows: overwrite them in place
    // (every warp has finished reading K from this stage: P was published after S).
    const bool has_prefix = tile_start < L;
    const bool has_draft = min(tile_start + kBlockN, kv_end) > L;
    if ((has_prefix && p.separate_v_buf) || (has_draft && p.separate_v_ext)) {
      issue_v(stage, resolve(it, false));  // slow path: a direct index lookup is fine
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
    }

    // ---- O += P V over this warp's 64 V columns; each V fragment feeds both m-tiles.
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks) {
      uint32_t pa[kMTiles][4];
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
        ldmatrix_x4(pa[mi], p_smem + p_offset(mi * 16 + (lane & 15), ks * 2 + (lane >> 4)));
      const int tok = ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
      for (int np = 0; np < kVTiles / 2; ++np) {
        const int c = (warp * kVSlice + np * 16) / 8 + (lane >> 4);
        uint32_t r[4];
        ldmatrix_x4_trans(r, kv_smem + kv_offset(tok, c));
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          ElemOps<Mma>::mma(o[mi][2 * np], pa[mi], r[0], r[1]);
          ElemOps<Mma>::mma(o[mi][2 * np + 1], pa[mi], r[2], r[3]);
        }
      }
    }
    // fp8: tile it + 1's pool rows into the other stage (free since the barrier at the top of
    // this iteration; the next iteration's barrier publishes them).
    store_kv(stage ^ 1);
  }
  cp_async_wait<0>();  // nothing may be in flight into shared memory when the CTA exits

  if constexpr (kRowMaxPass) {
    // This split's max score per row: quad-reduce the piece share, then over the 4 pieces.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = row_max_seen[h];
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      if ((lane & 3) == 0)
        row_stat[(piece_mi * 16 + (lane >> 2) + 8 * h) * kPiecesPerRow + piece] = mx;
    }
    __syncthreads();
    if (tid < kBlockM) {
      float mx = neg_inf();
#pragma unroll
      for (int k = 0; k < kPiecesPerRow; ++k) mx = fmaxf(mx, row_stat[tid * kPiecesPerRow + k]);
      const bool valid = mt * kBlockM + tid < rows;
      p.row_max[(static_cast<int64_t>(split) * p.num_tile_slots + slot) * kBlockM + tid] =
          valid ? mx : neg_inf();
    }
  } else {
    // ---- row sums: quad-reduce this thread's piece share, publish per piece, add the 4 pieces.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if ((lane & 3) == 0)
        row_stat[(piece_mi * 16 + (lane >> 2) + 8 * h) * kPiecesPerRow + piece] = l;
    }
    __syncthreads();

    // ---- epilogue: normalize; write the output directly (one split) or the partial.
    const bool direct = meta.num_splits == 1;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int mi = r >> 1;
      const int e0 = (r & 1) * 2;  // accumulator elements of this row in the m16n8 C layout
      const int row_local = mi * 16 + (lane >> 2) + 8 * (r & 1);
      float l = 0.f;
#pragma unroll
      for (int k = 0; k < kPiecesPerRow; ++k) l += row_stat[row_local * kPiecesPerRow + k];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const float lse = l > 0.f ? (m_run[r] + __log2f(l)) * kLn2 : neg_inf();
      if (!row_valid[r]) continue;
      const int col0 = warp * kVSlice + (lane & 3) * 2;
      const bool writes_lse = warp == 0 && (lane & 3) == 0;
      if (direct) {
        const int64_t tok = meta.qo_start + row_t[r];
        Elem* orow = reinterpret_cast<Elem*>(p.out) + tok * p.out_stride_tok +
                     static_cast<int64_t>(row_h[r]) * p.out_stride_head;
#pragma unroll
        for (int nt = 0; nt < kVTiles; ++nt)
          *reinterpret_cast<uint32_t*>(orow + col0 + nt * 8) =
              ElemOps<Elem>::pack(o[mi][nt][e0] * inv, o[mi][nt][e0 + 1] * inv);
        if (writes_lse)
          p.lse[tok * p.lse_stride_tok + static_cast<int64_t>(row_h[r]) * p.lse_stride_head] = lse;
      } else {
        const int64_t prow =
            (static_cast<int64_t>(split) * p.num_tile_slots + slot) * kBlockM + row_local;
        float* orow = p.o_part + prow * kHeadDimV;
#pragma unroll
        for (int nt = 0; nt < kVTiles; ++nt)
          *reinterpret_cast<float2*>(orow + col0 + nt * 8) =
              make_float2(o[mi][nt][e0] * inv, o[mi][nt][e0 + 1] * inv);
        if (writes_lse) p.lse_part[prow] = lse;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// One CTA per output row: LSE-weighted sum of the row's split partials (FlashInfer merge_state).
// Every warp derives the weights itself (all split LSEs, 4 per lane, reduced with shuffles) so no
// CTA barrier sits between the LSE loads and the partial loads: the first batch of partials is
// already in flight while the weights are computed. Warp w takes splits w, w + 8, ... in batches
// of kBatch (lane = 16 columns: 4 float4 per split), and the 8 warp sums meet in shared memory.
// Splits that saw no visible token carry lse = -inf and zero output, and get weight 0.
//
// Two batch sizes, chosen per launch by the host (launch_combine_t): one-round loads against
// occupancy. The wide one loads 72 splits per round, so a row of <= 72 splits (the 65 of B=1,
// H=8, T=8, 4k) takes one round trip of loads instead of three: ~1 us saved where the grid has
// at most ~128 rows. But it needs 185 registers on sm_90 and fits once per SM where the narrow
// one (94) fits twice, and used everywhere it cost up to 1.14x at grids of 256+ rows (run 57).
// Chosen per call, it gives 0.91-0.98x at the grid's B=1 calls of <= 128 rows and leaves the rest
// as they were (run 62).
constexpr int kCombineBatchWide = 9;    // 72 splits per round: one round at <= 72 splits
constexpr int kCombineBatchNarrow = 4;  // 32 splits per round: two CTAs per SM

template <typename Elem, int kBatch>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(const VerifyParams p) {
  __shared__ float weights[kCombineWarps][kMaxSplits];
  __shared__ float4 partial[kCombineWarps][kHeadDimV / 4];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t slot = blockIdx.x / kBlockM;
  const int r = blockIdx.x % kBlockM;
  if (slot >= p.num_tile_slots) return;
  const TileMeta tile = p.tiles[slot];
  if (tile.request < 0) return;
  const RequestMeta& meta = tile.req;
  if (meta.num_splits <= 1) return;
  const int H = p.num_heads;
  const int m = tile.row_tile * kBlockM + r;
  if (m >= meta.num_q * H) return;
  const int t = m / H;
  const int h = m % H;
  const int64_t split_stride = static_cast<int64_t>(p.num_tile_slots) * kBlockM;
  const int64_t base = slot * kBlockM + r;
  const int ns = meta.num_splits;
  const int64_t tok = meta.qo_start + t;
  wait_for_prerequisite_grid();  // the partials and LSEs of the attention kernel

  auto load_batch = [&](int s0, float4(&v)[kBatch][4]) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int s = s0 + u * kCombineWarps;
      const float4* src =
          reinterpret_cast<const float4*>(p.o_part + (base + s * split_stride) * kHeadDimV);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        v[u][k] = s < ns ? src[k * 32 + lane] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  float4 v[kBatch][4];
  load_batch(warp, v);

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
  for (int k = 0; k < kPerLane; ++k) weights[warp][lane + 32 * k] = l[k] * inv;  // 0 past ns
  if (warp == 0 && lane == 0)
    p.lse[tok * p.lse_stride_tok + static_cast<int64_t>(h) * p.lse_stride_head] =
        sum > 0.f ? m_use + __logf(sum) : neg_inf();
  __syncwarp();

  float4 acc[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = warp;; s0 += kBatch * kCombineWarps) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int s = s0 + u * kCombineWarps;
      const float wgt = s < ns ? weights[warp][s] : 0.f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        acc[k].x += wgt * v[u][k].x;
        acc[k].y += wgt * v[u][k].y;
        acc[k].z += wgt * v[u][k].z;
        acc[k].w += wgt * v[u][k].w;
      }
    }
    if (s0 + kBatch * kCombineWarps >= ns) break;
    load_batch(s0 + kBatch * kCombineWarps, v);
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) partial[warp][k * 32 + lane] = acc[k];
  __syncthreads();
  if (threadIdx.x < kHeadDimV / 4) {
    float4 total = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) {
      const float4 x = partial[w][threadIdx.x];
      total.x += x.x;
      total.y += x.y;
      total.z += x.z;
      total.w += x.w;
    }
    Elem* orow = reinterpret_cast<Elem*>(p.out) + tok * p.out_stride_tok +
                 static_cast<int64_t>(h) * p.out_stride_head;
    uint2 packed;
    packed.x = ElemOps<Elem>::pack(total.x, total.y);
    packed.y = ElemOps<Elem>::pack(total.z, total.w);
    *reinterpret_cast<uint2*>(orow + threadIdx.x * 4) = packed;
  }
}

// A per-device fact, queried once per device by `query(dev)` (a value >= 0) and then read from
// `cache` (0 = not yet queried, else 1 + the value). Device queries are not stream operations, so
// this is also fine during CUDA-graph capture. -1 when the current device cannot be determined.
constexpr int kMaxDevices = 64;
template <typename Query>
int64_t cached_per_device(int64_t (&cache)[kMaxDevices], Query query) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return -1;
  if (cache[dev] == 0) cache[dev] = 1 + query(dev);
  return cache[dev] - 1;
}

// Programmatic dependent launch needs compute capability 9.0.
bool device_supports_pdl() {
  static int64_t cache[kMaxDevices] = {};
  return cached_per_device(cache, [](int dev) -> int64_t {
           int major = 0;
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
           return major >= 9 ? 1 : 0;
         }) == 1;
}

// Launch `kernel` so that it may start while the previous kernel on `stream` is finishing (it
// must call wait_for_prerequisite_grid() before touching that kernel's output), or as a plain
// launch where the device has no programmatic dependent launch.
void launch_maybe_dependent(void (*kernel)(VerifyParams), dim3 grid, int threads, int smem,
                            cudaStream_t stream, const VerifyParams& p) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = device_supports_pdl() ? 1 : 0;
  cudaLaunchKernelEx(&cfg, kernel, p);
}

template <typename Elem, bool kFp8Kv, Fp8Numerics kNum>
void prepare_attention_kernel() {
  // Opt in to > 48 KB dynamic shared memory once per instantiation and device: the attribute
  // belongs to the kernel as loaded on the current device, so a process that uses a second GPU
  // must set it there too (tests/gpu/two_devices.py).
  static int64_t cache[kMaxDevices] = {};
  cached_per_device(cache, [](int) -> int64_t {
    cudaFuncSetAttribute(attention_kernel<Elem, kFp8Kv, kNum>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    return 1;
  });
}

template <typename Elem, bool kFp8Kv, Fp8Numerics kNum = Fp8Numerics::kFp16Operands>
void launch_attention_t(const VerifyParams& p, cudaStream_t stream) {
  prepare_attention_kernel<Elem, kFp8Kv, kNum>();
  launch_maybe_dependent(attention_kernel<Elem, kFp8Kv, kNum>, dim3(p.num_tile_slots, p.max_splits),
                         kThreads, kSmemBytes, stream, p);
}

// How many CTAs of the wide combine fit on the device at once (SMs x CTAs per SM), per device
// and dtype; later calls cost a table lookup. 0 where the device cannot be determined.
template <typename Elem>
int64_t wide_combine_wave() {
  static int64_t cache[kMaxDevices] = {};
  const int64_t wave = cached_per_device(cache, [](int dev) -> int64_t {
    int sms = 0, per_sm = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, combine_kernel<Elem, kCombineBatchWide>,
                                                  kCombineWarps * 32, 0);
    return static_cast<int64_t>(sms > 0 ? sms : 0) * (per_sm > 0 ? per_sm : 0);
  });
  return wave > 0 ? wave : 0;
}

template <typename Elem>
void launch_combine_t(const VerifyParams& p, cudaStream_t stream) {
  // One CTA per row, launched as a programmatic dependent of the attention kernel where the
  // device supports it. The wide batch where the rows with work run in one wave of it (no CTA
  // waits for a slot, and a row of <= 72 splits loads in one round trip), else the narrow batch's
  // two CTAs per SM. The grid's padding rows (slots past the last row tile, rows past a tile's
  // end) return before they wait, so only the T_total x H real rows count. Both depend only on
  // the shape, so a captured graph replays the same choice.
  const int64_t rows = static_cast<int64_t>(p.num_tile_slots) * kBlockM;
  const int64_t working_rows = static_cast<int64_t>(p.total_q) * p.num_heads;
  const auto kernel = working_rows <= wide_combine_wave<Elem>()
                          ? combine_kernel<Elem, kCombineBatchWide>
                          : combine_kernel<Elem, kCombineBatchNarrow>;
  launch_maybe_dependent(kernel, dim3(static_cast<unsigned>(rows)), kCombineWarps * 32, 0, stream,
                         p);
}

// The kernels' element type for `dtype`: calls f(ElemTag<Elem>{}), and ElemOf<decltype(tag)>
// names the type inside f, so each entry point below states its work once for both types.
template <typename Elem>
struct ElemTag {
  using type = Elem;
};
template <typename Tag>
using ElemOf = typename Tag::type;
template <typename F>
auto with_elem(DType dtype, F&& f) {
  return dtype == DType::kBF16 ? f(ElemTag<__nv_bfloat16>{}) : f(ElemTag<__half>{});
}

}  // namespace

void launch_plan(const VerifyParams& p, cudaStream_t stream) {
  plan_kernel<<<1, kPlanThreads, 0, stream>>>(p);
}

void launch_attention(const VerifyParams& p, DType dtype, cudaStream_t stream) {
  with_elem(dtype, [&](auto elem) {
    using Elem = ElemOf<decltype(elem)>;
    if (!p.kv_fp8) {
      launch_attention_t<Elem, false>(p, stream);
    } else if (!p.fp8_triton) {
      launch_attention_t<Elem, true>(p, stream);
    } else {
      // The split maxima first (a programmatic dependent too: the attention grid waits for it).
      if (p.max_splits > 1) launch_attention_t<Elem, true, Fp8Numerics::kTritonRowMax>(p, stream);
      launch_attention_t<Elem, true, Fp8Numerics::kTriton>(p, stream);
    }
  });
}

void launch_combine(const VerifyParams& p, DType dtype, cudaStream_t stream) {
  if (p.max_splits <= 1) return;  // every request is written directly by the attention kernel
  with_elem(dtype, [&](auto elem) { launch_combine_t<ElemOf<decltype(elem)>>(p, stream); });
}

int attention_ctas_per_sm(DType dtype) {
  return with_elem(dtype, [](auto elem) {
    using Elem = ElemOf<decltype(elem)>;
    // The fp8-pool instantiation has the same shared memory, hence the same occupancy.
    prepare_attention_kernel<Elem, false, Fp8Numerics::kFp16Operands>();
    int n = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &n, attention_kernel<Elem, false, Fp8Numerics::kFp16Operands>, kThreads, kSmemBytes);
    return n > 0 ? n : 1;
  });
}

}  // namespace kdtree
