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
constexpr int kBlockN = 32;  // KV tokens per tile
constexpr int kStages = 2;   // cp.async double buffering of the KV tile
constexpr int kQkSlice = kHeadDimQK / kWarpsPerGroup;  // 144 = 9 k16 steps per warp
constexpr int kVSlice = kHeadDimV / kWarpsPerGroup;    // 128 = 16 n8 tiles per warp
// A KV row in shared memory is padded by 16 bytes so that the 8 rows an ldmatrix reads fall into
// 8 different 16-byte bank groups (1168 B = 292 words = 4 banks shift per row).
constexpr int kKvRowBytes = kHeadDimQK * 2 + 16;
constexpr int kKvStageBytes = kBlockN * kKvRowBytes;
// Exchange area for the partial S tiles (16 rows x 32 tokens fp32 per warp).
constexpr int kXchBytes = kWarps * 16 * kBlockN * 4;
constexpr int kSmemBytes = kStages * kKvStageBytes + kXchBytes;
constexpr int kSm120MaxSmemPerBlock = 101376;
static_assert(kSmemBytes <= kSm120MaxSmemPerBlock, "kernel must fit sm_120's 99 KB per block");
static_assert(kQkSlice % 16 == 0 && kVSlice % 16 == 0, "warp slices must be whole MMA steps");

constexpr int kChunkMinTokens = 2 * kBlockN;  // smallest split: two KV tiles
constexpr int kMaxSplits = 128;               // cap on splits per (request, row tile)
constexpr int kCombineWarps = 8;              // rows merged per combine CTA

}  // namespace kdtree
