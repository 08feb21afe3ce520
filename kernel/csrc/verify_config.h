// Compile-time configuration of the MLA tree-verify kernel. Plain C++ (no CUDA) so that host-only
// tools (the CI shared-memory probe, the binding) can include it.
#pragma once

namespace kdtree {

constexpr int kHeadDimQK = 576;  // 512 latent + 64 rope
constexpr int kHeadDimV = 512;   // V = first 512 columns of the latent KV row
constexpr int kBlockM = 32;      // query rows (draft token x head) per CTA: two m16 MMA tiles
constexpr int kMTiles = kBlockM / 16;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockN = 32;  // KV tokens per tile: one load stage and one compute step
// Double buffering: tile i + 1 is in flight while tile i is computed. A third 32-token stage
// would not fit in sm_120's 99 KB next to the exchange areas.
constexpr int kStages = 2;
// S = Q K^T: warp w takes the 16-token half (w / 4) of the tile and the 144-column quarter (w % 4)
// of the 576 dims, for all 32 rows (Q fragments stay in registers). The 4 partial S tiles of a
// token half are reduced through shared memory, each warp summing one 16 x 8 piece.
constexpr int kDimSplits = 4;
constexpr int kTokenHalves = kWarps / kDimSplits;
constexpr int kQkSlice = kHeadDimQK / kDimSplits;  // 144 = 9 k16 steps
constexpr int kHalfN = kBlockN / kTokenHalves;     // 16 tokens = 2 n8 tiles
// O += P V: warp w owns 64 of the 512 V columns for all 32 rows (2 x 8 m16n8 accumulators), and
// reads P (bf16, written once by the warps that computed it) from shared memory.
constexpr int kVSlice = kHeadDimV / kWarps;  // 64
// A KV row in shared memory is 1152 B (a multiple of 128 B). Its 16-byte chunks are XOR-swizzled
// with (row & 7) so the 8 rows an ldmatrix reads hit 8 different bank groups.
constexpr int kKvRowBytes = kHeadDimQK * 2;
constexpr int kKvRowChunks = kKvRowBytes / 16;  // 72
constexpr int kKvStageBytes = kBlockN * kKvRowBytes;
// Partial S tiles (fp32, 32 rows x 16 tokens per warp), P (bf16, 32 x 32) and per-row statistics
// (one float per row and S piece: running-max candidates, then the final row sums).
constexpr int kXchBytes = kWarps * kBlockM * kHalfN * 4;
constexpr int kPBytes = kBlockM * kBlockN * 2;
constexpr int kPiecesPerRow = kTokenHalves * (kHalfN / 8);  // 4
constexpr int kRowStatBytes = kBlockM * kPiecesPerRow * 4;
// Ring of prefetched kv_indices: the indices of tile i + 2 are fetched (cp.async) with the KV of
// tile i + 1, so no dependent DRAM round trip sits between two KV tiles.
constexpr int kIdxRing = 4;
constexpr int kIdxSlotBytes = kBlockN * 8;
constexpr int kIdxRingBytes = kIdxRing * kIdxSlotBytes;
static_assert(kIdxRing >= 3, "index ring must hold the tiles in use, in flight and next");
constexpr int kXchOffset = kStages * kKvStageBytes;
constexpr int kPOffset = kXchOffset + kXchBytes;
constexpr int kRowStatOffset = kPOffset + kPBytes;
constexpr int kIdxRingOffset = kRowStatOffset + kRowStatBytes;
constexpr int kSmemBytes = kIdxRingOffset + kIdxRingBytes;
// Lazy softmax rescale (log2 units): O and the running sums are rescaled only when a row's max
// grows by more than this, so P = exp2(s - stale max) stays below 2^8.
constexpr float kRescaleLog2 = 8.f;
constexpr int kSm120MaxSmemPerBlock = 101376;
static_assert(kSmemBytes <= kSm120MaxSmemPerBlock, "kernel must fit sm_120's 99 KB per block");
static_assert(kQkSlice % 16 == 0 && kVSlice % 16 == 0 && kHalfN == 16,
              "warp slices must be whole MMA steps");

constexpr int kChunkMinTokens = 2 * kBlockN;  // smallest split: two KV tiles
constexpr int kMaxSplits = 128;               // cap on splits per (request, row tile)
constexpr int kCombineWarps = 8;              // warps of a combine CTA (one output row)
constexpr int kPlanThreads = 256;             // the plan kernel's one CTA

}  // namespace kdtree
