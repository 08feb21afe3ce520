// The only contract between the pybind11 binding and the CUDA kernels (in the spirit of
// FlashAttention's Flash_fwd_params / FlashMLA's params.h). All strides are in elements.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace kdtree {

// Per-request scheduling metadata written by the plan kernel, read by the attention and combine
// kernels. Everything is derived on the device from qo_indptr / kv_indptr (no host sync).
struct RequestMeta {
  int64_t kv_start;    // offset of the request's prefix in kv_indices
  int64_t mask_start;  // offset of the request's N x (prefix + N) block in custom_mask
  int32_t qo_start;    // first draft-token row of the request in q / out
  int32_t num_q;       // N: draft tokens of the request
  int32_t prefix_len;  // L: committed prefix tokens
  int32_t num_splits;  // KV splits of the virtual sequence (prefix + N draft tokens)
};

static_assert(sizeof(RequestMeta) == 32, "RequestMeta is two int64 and four int32");

// One row tile's schedule: its request's metadata copied next to the tile's own indices, so that
// a CTA finds everything in one 48-byte load instead of two dependent ones (tile -> request ->
// metadata). Written by the plan kernel once per forward.
struct alignas(16) TileMeta {
  RequestMeta req;
  int32_t request;   // -1: an empty slot
  int32_t row_tile;  // index of the 32-row tile within its request
  int64_t reserved;
};

static_assert(sizeof(TileMeta) == 48, "kdtree_verify/plan.py assumes 48-byte TileMeta");

struct VerifyParams {
  // Inputs (bf16 or fp16; the kernel is templated on the element type).
  const void* q;
  int64_t q_stride_tok, q_stride_head;
  // Every Q row starts 16-byte aligned (copied to shared memory in 16-byte pieces).
  bool q_rows_16b;
  const void* k_ext;
  int64_t k_ext_stride;
  const void* v_ext;
  int64_t v_ext_stride;
  // The paged KV pool: q's dtype, or float8_e4m3fn (kv_fp8) holding K / k_scale, whose V is the
  // first 512 columns of the same rows. Strides in elements (bytes for fp8).
  const void* k_buf;
  int64_t k_buf_stride;
  const void* v_buf;
  int64_t v_buf_stride;
  bool kv_fp8;
  // fp8 pool only: a prefix token's score is (q . k8) * k_scale * sm_scale and its value v8 *
  // v_scale (SGLang's k_descale / v_descale); the draft tokens' bf16 KV is used as is.
  float k_scale, v_scale;
  // fp8 pool only: SGLang's Triton numerics (q and the prefix's P rounded to e4m3, the draft's P
  // to bf16, P taken against the running max of every token before it) instead of fp16 operands.
  bool fp8_triton;
  const void* kv_indices;
  bool kv_indices_64;
  const void* qo_indptr;
  bool qo_indptr_64;
  const void* kv_indptr;
  bool kv_indptr_64;
  const uint8_t* mask;      // nullptr: causal draft block
  const void* mask_indptr;  // nullptr: derived as cumsum(N * (L + N))
  bool mask_indptr_64;
  bool separate_v_buf;  // v_buffer is not the first 512 columns of k_buffer's rows
  bool separate_v_ext;  // v_extend is not the first 512 columns of k_extend's rows

  // Outputs.
  void* out;
  int64_t out_stride_tok, out_stride_head;
  float* lse;  // natural-log LSE of the scaled scores
  int64_t lse_stride_tok, lse_stride_head;

  float scale_log2;  // sm_scale * log2(e)
  int batch;
  int num_heads;
  int total_q;  // T_total (rows of q)

  // Plan (static maxima chosen on the host; the rest computed on the device).
  int num_tile_slots;  // upper bound on sum_b ceil(N_b * H / kBlockM)
  int max_splits;      // grid.y of the attention kernel
  int target_ctas;     // CTAs the plan aims for (SMs x resident CTAs per SM)

  // Workspace (see kdtree_verify/plan.py for the size formula).
  TileMeta* tiles;  // [num_tile_slots]
  int32_t* chunk;   // [1] KV tokens per split (multiple of kBlockN)
  float* o_part;    // [max_splits * num_tile_slots * kBlockM, 512] normalized partial outputs
  float* lse_part;  // [max_splits * num_tile_slots * kBlockM] partial LSE (natural log)
  float* row_max;   // [max_splits * num_tile_slots * kBlockM] fp8_triton: each split's max score
};

enum class DType { kBF16 = 0, kFP16 = 1 };

// Launchers (verify_kernel.cu). All enqueue on `stream` and never synchronize.
void launch_plan(const VerifyParams& p, cudaStream_t stream);
void launch_attention(const VerifyParams& p, DType dtype, cudaStream_t stream);
void launch_combine(const VerifyParams& p, DType dtype, cudaStream_t stream);
// CTAs of the attention kernel that fit on one SM at once (for sizing the plan).
int attention_ctas_per_sm(DType dtype);

}  // namespace kdtree
