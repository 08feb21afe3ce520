// pybind11 binding: turns torch tensors into VerifyParams and launches on the current stream.
// Input validation with readable messages lives in kdtree_verify/cuda.py; the TORCH_CHECKs here
// guard the memory-safety preconditions of the kernels (dtype, device, alignment, strides).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <optional>
#include <vector>

#include "verify_config.h"
#include "verify_params.h"

namespace {

using kdtree::kBlockM;
using kdtree::kHeadDimQK;
using kdtree::kHeadDimV;

constexpr int64_t kAlign = 256;

// The workspace layout is computed in kdtree_verify/plan.py (WorkspaceLayout, which documents the
// size formula); here we only check that every region the kernels touch lies inside the tensor.
// offsets = [tiles, chunk, lse_part, o_part, row_max] in bytes.
void attach_workspace(kdtree::VerifyParams& p, const torch::Tensor& ws,
                      const std::vector<int64_t>& offsets, int64_t slots, int64_t max_splits) {
  TORCH_CHECK(ws.is_cuda() && ws.scalar_type() == torch::kUInt8 && ws.is_contiguous(),
              "workspace must be a contiguous uint8 CUDA tensor");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(ws.data_ptr()) % kAlign == 0,
              "workspace must be 256-byte aligned");
  constexpr int kRegions = 5;
  TORCH_CHECK(offsets.size() == kRegions, "workspace offsets: expected ", kRegions, " entries");
  TORCH_CHECK(slots >= 1 && max_splits >= 1 && max_splits <= kdtree::kMaxSplits,
              "plan: bad num_tile_slots / max_splits");
  const int64_t part_rows = max_splits > 1 ? max_splits * slots * kBlockM : 0;
  const int64_t sizes[kRegions] = {slots * static_cast<int64_t>(sizeof(kdtree::TileMeta)), 4,
                                   part_rows * 4, part_rows * kHeadDimV * 4, part_rows * 4};
  for (int i = 0; i < kRegions; ++i) {
    TORCH_CHECK(offsets[i] >= 0 && offsets[i] % 16 == 0 && offsets[i] + sizes[i] <= ws.numel(),
                "workspace region ", i, " [", offsets[i], ", +", sizes[i],
                ") is misaligned or outside the workspace of ", ws.numel(), " bytes");
  }
  auto* base = static_cast<uint8_t*>(ws.data_ptr());
  p.tiles = reinterpret_cast<kdtree::TileMeta*>(base + offsets[0]);
  p.chunk = reinterpret_cast<int32_t*>(base + offsets[1]);
  p.lse_part = reinterpret_cast<float*>(base + offsets[2]);
  p.o_part = reinterpret_cast<float*>(base + offsets[3]);
  p.row_max = reinterpret_cast<float*>(base + offsets[4]);
  p.num_tile_slots = static_cast<int>(slots);
  p.max_splits = static_cast<int>(max_splits);
}

bool is_index_64(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.dim() == 1 && t.is_contiguous(), name,
              " must be a contiguous 1-D CUDA tensor");
  TORCH_CHECK(t.scalar_type() == torch::kInt64 || t.scalar_type() == torch::kInt32, name,
              " must be int32 or int64");
  return t.scalar_type() == torch::kInt64;
}

void plan(const torch::Tensor& qo_indptr, const torch::Tensor& kv_indptr,
          const std::optional<torch::Tensor>& mask_indptr, const torch::Tensor& workspace,
          const std::vector<int64_t>& offsets, int64_t batch, int64_t num_heads, int64_t slots,
          int64_t max_splits, int64_t target_ctas) {
  const c10::cuda::CUDAGuard guard(workspace.device());
  kdtree::VerifyParams p{};
  TORCH_CHECK(qo_indptr.numel() == batch + 1 && kv_indptr.numel() == batch + 1,
              "qo_indptr and kv_indptr must have batch + 1 entries");
  p.qo_indptr = qo_indptr.data_ptr();
  p.qo_indptr_64 = is_index_64(qo_indptr, "qo_indptr");
  p.kv_indptr = kv_indptr.data_ptr();
  p.kv_indptr_64 = is_index_64(kv_indptr, "kv_indptr");
  if (mask_indptr.has_value()) {
    TORCH_CHECK(mask_indptr->numel() >= batch + 1, "mask_indptr must have batch + 1 entries");
    p.mask_indptr = mask_indptr->data_ptr();
    p.mask_indptr_64 = is_index_64(*mask_indptr, "mask_indptr");
  }
  p.batch = static_cast<int>(batch);
  p.num_heads = static_cast<int>(num_heads);
  p.target_ctas = static_cast<int>(target_ctas);
  attach_workspace(p, workspace, offsets, slots, max_splits);
  kdtree::launch_plan(p, at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void check_rows(const torch::Tensor& t, const char* name, int64_t cols, torch::ScalarType dtype) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == dtype, name, " must have the dtype of q");
  TORCH_CHECK(t.dim() == 3 && t.size(1) == 1 && t.size(2) == cols, name, " must be [*, 1, ", cols,
              "]");
  TORCH_CHECK(t.stride(2) == 1, name, " must be contiguous in its last dimension");
  TORCH_CHECK(t.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name,
              " rows must be 16-byte aligned (token stride a multiple of 8 elements)");
}

// An fp8 pool is read in 8-byte pieces from K's rows only: the kernel takes V from the K tile in
// shared memory, so v_buffer is never read here. That V is K's first 512 columns is the Python
// front door's rule (kdtree_verify.cuda.check_supported), where a caller can still fall back.
void check_fp8_pool(const torch::Tensor& k_buf) {
  TORCH_CHECK(k_buf.is_cuda(), "k_buffer must be a CUDA tensor");
  TORCH_CHECK(
      k_buf.dim() == 3 && k_buf.size(1) == 1 && k_buf.size(2) == kHeadDimQK && k_buf.stride(2) == 1,
      "k_buffer must be [*, 1, 576] contiguous in its last dimension");
  TORCH_CHECK(k_buf.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(k_buf.data_ptr()) % 8 == 0,
              "fp8 k_buffer rows must be 8-byte aligned (token stride a multiple of 8)");
}

// The arguments of attend(), by name (a params object in the FlashInfer and FlashMLA manner):
// kdtree_verify/cuda.py fills one per call. The shapes and dtypes are attend()'s checks below.
struct AttendArgs {
  // q [T, H, 576]; the new tokens' K [*, 1, 576] and V [*, 1, 512]; the KV pool, K and V.
  torch::Tensor q, k_extend, v_extend, k_buffer, v_buffer;
  torch::Tensor kv_indices;                  // pool rows of every request's prefix, int32/int64
  std::optional<torch::Tensor> custom_mask;  // bool or uint8, 1-D; or none
  torch::Tensor out, lse;                    // written: [T, H, 512] in q's dtype, [T, H] fp32
  // The plan (kdtree_verify/plan.py): its workspace, the region offsets and sizes.
  torch::Tensor workspace;
  std::vector<int64_t> offsets;
  int64_t batch = 0;
  int64_t num_tile_slots = 0;
  int64_t max_splits = 0;
  double sm_scale = 0.0;
  // An fp8 (float8_e4m3fn) pool: its dequantization scales and SGLang's roundings (triton).
  double k_scale = 1.0;
  double v_scale = 1.0;
  bool fp8_triton = false;
};

void attend(const AttendArgs& a) {
  TORCH_CHECK(a.q.defined() && a.k_extend.defined() && a.v_extend.defined() &&
                  a.k_buffer.defined() && a.v_buffer.defined() && a.kv_indices.defined() &&
                  a.out.defined() && a.lse.defined() && a.workspace.defined(),
              "attend: every tensor of AttendArgs must be set (custom_mask may be None)");
  const torch::Tensor& q = a.q;
  const torch::Tensor& k_ext = a.k_extend;
  const torch::Tensor& v_ext = a.v_extend;
  const torch::Tensor& k_buf = a.k_buffer;
  const torch::Tensor& v_buf = a.v_buffer;
  const torch::Tensor& out = a.out;
  const torch::Tensor& lse = a.lse;
  const std::optional<torch::Tensor>& mask = a.custom_mask;
  const c10::cuda::CUDAGuard guard(q.device());
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == torch::kBFloat16 || dtype == torch::kFloat16, "q must be bf16 or fp16");
  TORCH_CHECK(q.is_cuda() && q.dim() == 3 && q.size(2) == kHeadDimQK && q.stride(2) == 1,
              "q must be a CUDA tensor [T, H, 576] contiguous in its last dimension");
  TORCH_CHECK(q.stride(0) % 2 == 0 && q.stride(1) % 2 == 0 &&
                  reinterpret_cast<uintptr_t>(q.data_ptr()) % 4 == 0,
              "q rows must be 4-byte aligned");
  check_rows(k_ext, "k_extend", kHeadDimQK, dtype);
  check_rows(v_ext, "v_extend", kHeadDimV, dtype);
  const bool kv_fp8 = k_buf.scalar_type() == at::ScalarType::Float8_e4m3fn;
  if (kv_fp8) {
    check_fp8_pool(k_buf);
    TORCH_CHECK(a.k_scale > 0 && a.v_scale > 0, "k_scale and v_scale must be positive");
  } else {
    check_rows(k_buf, "k_buffer", kHeadDimQK, dtype);
    check_rows(v_buf, "v_buffer", kHeadDimV, dtype);
  }
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == dtype && out.dim() == 3 &&
                  out.size(0) == q.size(0) && out.size(1) == q.size(1) &&
                  out.size(2) == kHeadDimV && out.stride(2) == 1,
              "out must be [T, H, 512] with q's dtype, contiguous in its last dimension");
  TORCH_CHECK(out.stride(0) % 4 == 0 && out.stride(1) % 4 == 0 &&
                  reinterpret_cast<uintptr_t>(out.data_ptr()) % 8 == 0,
              "out rows must be 8-byte aligned");
  TORCH_CHECK(lse.is_cuda() && lse.scalar_type() == torch::kFloat32 && lse.dim() == 2 &&
                  lse.size(0) == q.size(0) && lse.size(1) == q.size(1),
              "lse must be a float32 CUDA tensor [T, H]");

  kdtree::VerifyParams p{};
  p.q = q.data_ptr();
  p.q_stride_tok = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.q_rows_16b = reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0 && q.stride(0) % 8 == 0 &&
                 q.stride(1) % 8 == 0;
  p.k_ext = k_ext.data_ptr();
  p.k_ext_stride = k_ext.stride(0);
  p.v_ext = v_ext.data_ptr();
  p.v_ext_stride = v_ext.stride(0);
  p.k_buf = k_buf.data_ptr();
  p.k_buf_stride = k_buf.stride(0);
  p.v_buf = v_buf.data_ptr();
  p.v_buf_stride = v_buf.stride(0);
  p.kv_fp8 = kv_fp8;
  p.k_scale = static_cast<float>(a.k_scale);
  p.v_scale = static_cast<float>(a.v_scale);
  p.fp8_triton = kv_fp8 && a.fp8_triton;
  p.kv_indices = a.kv_indices.numel() > 0 ? a.kv_indices.data_ptr() : nullptr;
  p.kv_indices_64 = is_index_64(a.kv_indices, "kv_indices");
  // V is read from the K tile in shared memory when it is the first 512 columns of the same rows.
  p.separate_v_buf = !(v_buf.data_ptr() == k_buf.data_ptr() && v_buf.stride(0) == k_buf.stride(0));
  p.separate_v_ext = !(v_ext.data_ptr() == k_ext.data_ptr() && v_ext.stride(0) == k_ext.stride(0));
  if (mask.has_value()) {
    TORCH_CHECK(mask->is_cuda() && mask->dim() == 1 && mask->is_contiguous() &&
                    (mask->scalar_type() == torch::kUInt8 || mask->scalar_type() == torch::kBool),
                "custom_mask must be a contiguous 1-D bool/uint8 CUDA tensor");
    p.mask = static_cast<const uint8_t*>(mask->data_ptr());
  }
  p.out = out.data_ptr();
  p.out_stride_tok = out.stride(0);
  p.out_stride_head = out.stride(1);
  p.lse = lse.data_ptr<float>();
  p.lse_stride_tok = lse.stride(0);
  p.lse_stride_head = lse.stride(1);
  p.scale_log2 = static_cast<float>(a.sm_scale * 1.4426950408889634);
  p.batch = static_cast<int>(a.batch);
  p.num_heads = static_cast<int>(q.size(1));
  p.total_q = static_cast<int>(q.size(0));
  attach_workspace(p, a.workspace, a.offsets, a.num_tile_slots, a.max_splits);
  const auto kind = dtype == torch::kBFloat16 ? kdtree::DType::kBF16 : kdtree::DType::kFP16;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  kdtree::launch_attention(p, kind, stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  kdtree::launch_combine(p, kind, stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

int64_t ctas_per_sm(bool bf16) {
  return kdtree::attention_ctas_per_sm(bf16 ? kdtree::DType::kBF16 : kdtree::DType::kFP16);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "kdtree MLA tree-verify attention CUDA kernels";
  m.def("plan", &plan, "launch the plan kernel (per forward)");
  py::class_<AttendArgs>(m, "AttendArgs", "the arguments of attend(), set by name")
      .def(py::init<>())
      .def_readwrite("q", &AttendArgs::q)
      .def_readwrite("k_extend", &AttendArgs::k_extend)
      .def_readwrite("v_extend", &AttendArgs::v_extend)
      .def_readwrite("k_buffer", &AttendArgs::k_buffer)
      .def_readwrite("v_buffer", &AttendArgs::v_buffer)
      .def_readwrite("kv_indices", &AttendArgs::kv_indices)
      .def_readwrite("custom_mask", &AttendArgs::custom_mask)
      .def_readwrite("out", &AttendArgs::out)
      .def_readwrite("lse", &AttendArgs::lse)
      .def_readwrite("workspace", &AttendArgs::workspace)
      .def_readwrite("offsets", &AttendArgs::offsets)
      .def_readwrite("batch", &AttendArgs::batch)
      .def_readwrite("num_tile_slots", &AttendArgs::num_tile_slots)
      .def_readwrite("max_splits", &AttendArgs::max_splits)
      .def_readwrite("sm_scale", &AttendArgs::sm_scale)
      .def_readwrite("k_scale", &AttendArgs::k_scale)
      .def_readwrite("v_scale", &AttendArgs::v_scale)
      .def_readwrite("fp8_triton", &AttendArgs::fp8_triton);
  m.def("attend", &attend, py::arg("args"),
        "launch attention (+ combine) with a planned workspace");
  m.def("ctas_per_sm", &ctas_per_sm, "resident attention CTAs per SM");
  m.attr("BLOCK_M") = kBlockM;
  m.attr("HEAD_DIM_QK") = kHeadDimQK;
  m.attr("HEAD_DIM_V") = kHeadDimV;
  m.attr("MAX_SPLITS") = kdtree::kMaxSplits;
}
