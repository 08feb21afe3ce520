// Compile-time configuration of the MLA tree-verify kernel. Plain C++ (no CUDA) so that host-only
// tools (the CI shared-memory probe, the binding) can include it.
#pragma once

namespace kdtree {

constexpr int kHeadDimQK = 576;  // 512 latent + 64 rope
constexpr int kHeadDimV = 512;   // V = first 512 columns of the latent KV row
constexpr int kBlockM = 32;      // query rows (draft token x head) per CTA: 2 row groups of 16
constexpr int kRowGroups = kBlockM / 16;
constexpr int kWarpsPerGroup = 4;  // each splits the 576-reduction of S and the 512 V columns in 4
constexpr int kWarps = kRowGroups * kWarpsPerGroup;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockN = 16;  // KV tokens per tile
// cp.async pipeline depth: kStages - 1 tiles are in flight while one is computed. Deep because one
// 256-thread CTA per SM must keep enough bytes in flight to cover DRAM latency on its own.
constexpr int kStages = 5;
constexpr int kQkSlice = kHeadDimQK / kWarpsPerGroup;  // 144 = 9 k16 steps per warp
constexpr int kVSlice = kHeadDimV / kWarpsPerGroup;    // 128 = 16 n8 tiles per warp
// A KV row in shared memory is 1152 B (a multiple of 128 B). Its 16-byte chunks are XOR-swizzled
// with (row & 7) so the 8 rows an ldmatrix reads hit 8 different bank groups.
constexpr int kKvRowBytes = kHeadDimQK * 2;
constexpr int kKvRowChunks = kKvRowBytes / 16;  // 72
constexpr int kKvStageBytes = kBlockN * kKvRowBytes;
// Exchange area for the partial S tiles (16 rows x kBlockN tokens fp32 per warp).
constexpr int kXchBytes = kWarps * 16 * kBlockN * 4;
// Ring of prefetched kv_indices: the indices of a tile are fetched (cp.async) kStages - 1 tiles
// before its KV is, so no dependent DRAM round trip sits between two KV tiles.
constexpr int kIdxRing = 8;
constexpr int kIdxSlotBytes = kBlockN * 8;
constexpr int kIdxRingBytes = kIdxRing * kIdxSlotBytes;
static_assert(kIdxRing >= 2 * (kStages - 1), "index ring must cover two pipeline depths");
constexpr int kSmemBytes = kStages * kKvStageBytes + kXchBytes + kIdxRingBytes;
constexpr int kSm120MaxSmemPerBlock = 101376;
static_assert(kSmemBytes <= kSm120MaxSmemPerBlock, "kernel must fit sm_120's 99 KB per block");
static_assert(kQkSlice % 16 == 0 && kVSlice % 16 == 0, "warp slices must be whole MMA steps");

constexpr int kChunkMinTokens = 4 * kBlockN;  // smallest split: four KV tiles
constexpr int kMaxSplits = 128;               // cap on splits per (request, row tile)
constexpr int kCombineWarps = 8;              // warps of a combine CTA (one output row)

}  // namespace kdtree
