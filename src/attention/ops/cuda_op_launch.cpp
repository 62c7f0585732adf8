// op: cuda's launches (see cuda_op_launch.h).
#include "attention/ops/cuda_op_launch.h"

#include <algorithm>
#include <atomic>
#include <limits>

#include "attention/document_mask.h"
#include "attention/ops/chunk_common.h"
#include "attention/ops/cuda_op.h"
#include "attention/ops/cuda_scan.h"
#include "attention/ops/feature_gradients.h"
#include "attention/ops/sub_chunk.h"

#ifdef DARKFORMER_CUDA_OP
#include <c10/cuda/CUDAGuard.h>
#endif

namespace darkformer::cuda_op_launch {

Chunking ChunkingFor(int64_t chunk) {
  const int64_t sub = causal_ops::SubChunk(chunk);
  return {sub, std::max<int64_t>(1, chunk / sub)};
}

namespace {

// The per-chunk launches' blocks: as many as run at once on the device (more add only scratch),
// each taking several chunks in turn; the host emulation has no such limit unless a test sets one
// (LimitCudaOpBlocksForTesting, below).
std::atomic<int64_t> blocks_for_testing{0};
int64_t ResidentBlocks(const torch::Tensor& on, bool backward) {
  if (blocks_for_testing > 0) return blocks_for_testing;
  if (on.is_cpu()) return std::numeric_limits<int64_t>::max();
#ifdef DARKFORMER_CUDA_OP
  const c10::cuda::CUDAGuard guard(on.device());
  return cuda_scan::ResidentBlocks(backward);
#else
  return 1;  // unreachable: CheckWhere refuses CUDA inputs in a build without the kernels
#endif
}

}  // namespace

cuda_scan::Launch MakeLaunch(int64_t heads, const torch::Tensor& l, const torch::Tensor& v, int64_t sub,
                             int64_t group_subs, const torch::Tensor& document_ids_BL, torch::Tensor& ids,
                             torch::Tensor& resets) {
  cuda_scan::Launch x;
  x.rows = l.size(0) * l.size(1);
  x.rows_per_sequence = l.size(1);
  x.length = l.size(2);
  x.features = l.size(3);
  x.value_dim = v.size(3);
  x.group = heads / l.size(1);
  x.sub = sub;
  x.group_subs = group_subs;
  x.value_rows_per = l.size(1) / v.size(1);
  x.l = l.data_ptr<float>();
  x.v = v.data_ptr<float>();
  x.chunk_count = x.rows * x.Chunks();
  x.forward_blocks = std::max<int64_t>(1, std::min(x.chunk_count, ResidentBlocks(l, /*backward=*/false)));
  resets = torch::empty({x.chunk_count}, l.options());
  x.resets = resets.data_ptr<float>();
  if (!document_ids_BL.defined()) return x;
  CheckDocumentIds(document_ids_BL, l.size(0), x.length);
  // No copy where the ids already live on the device as int64; never read on the host.
  ids = document_ids_BL.to(l.device(), torch::kInt64).contiguous();
  x.ids = ids.data_ptr<int64_t>();
  return x;
}

// The backward's scratch is held to this many bytes by giving each row fewer blocks.
constexpr int64_t kBackwardScratchBytes = int64_t{256} << 20;

int64_t BackwardBlocks(const cuda_scan::Launch& x, const torch::Tensor& on) {
  const int64_t resident = ResidentBlocks(on, /*backward=*/true);
  const int64_t per_row = resident / x.rows + (resident % x.rows != 0 ? 1 : 0);
  const int64_t budget = kBackwardScratchBytes / (x.rows * x.ScratchFloats(true) * 4);
  return std::max<int64_t>(1, std::min({x.Chunks(), per_row, budget}));
}

torch::Tensor Scratch(const cuda_scan::Launch& x, bool backward, const torch::TensorOptions& options) {
  return torch::empty({backward ? x.rows * x.backward_blocks : std::max(x.forward_blocks, x.rows * x.Slices()),
                       x.ScratchFloats(backward)},
                      options);
}

torch::Tensor PerChunk(const cuda_scan::Launch& x, bool with_values, const torch::TensorOptions& options) {
  return with_values ? torch::empty({x.chunk_count, x.features, x.value_dim + 1}, options)
                     : torch::empty({x.chunk_count, x.features}, options);
}

ForwardBuffers::ForwardBuffers(cuda_scan::Launch& x, const torch::TensorOptions& options)
    : states(PerChunk(x, true, options)), refs(PerChunk(x, false, options)), scratch(Scratch(x, false, options)) {
  x.states = states.data_ptr<float>();
  x.refs = refs.data_ptr<float>();
  x.scratch = scratch.data_ptr<float>();
}

torch::Tensor KeyFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& y,
                          int64_t rows) {
  torch::NoGradGuard no_grad;
  return causal_ops::SideLogFeatures(map, p, causal_ops::PerRow(y, rows), torch::kFloat32, /*is_query=*/false)
      .mul_(causal_ops::kLog2E)
      .contiguous();
}

QuerySide MakeQuerySide(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  QuerySide q;
  // W that learns needs d log phi itself; an fp16 query would need its own loads.
  const bool inside = map.positive_features && !p.at(0).requires_grad() &&
                      (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16);
  if (!inside) {
    q.a = causal_ops::SideLogFeatures(map, p, x, torch::kFloat32, /*is_query=*/true).mul_(causal_ops::kLog2E).contiguous();
    return q;
  }
  q.x = x;
  q.w = p[0].detach().to(torch::kFloat32).contiguous();
  const auto w_RM = q.w.t();
  q.proj = (map.input_map ? torch::matmul(p.at(1).detach().to(torch::kFloat32)[0], w_RM)
                          : (w_RM * map.input_scale).unsqueeze(0))
               .mul_(causal_ops::kLog2E)
               .contiguous();
  return q;
}

void PointQueries(cuda_scan::Launch& launch, const QuerySide& q) {
  if (!q.Inside()) {
    launch.a = q.a.data_ptr<float>();
    return;
  }
  launch.x = q.x.data_ptr();
  launch.x_bf16 = q.x.scalar_type() == torch::kBFloat16;
  for (int i = 0; i < 4; ++i) launch.x_strides[i] = q.x.stride(i);
  launch.dim = q.x.size(3);
  launch.proj = q.proj.data_ptr<float>();
  launch.proj_per_head = q.proj.size(0) > 1;
  launch.w = q.w.data_ptr<float>();
  launch.mapped_dim = q.w.size(1);
}

}  // namespace darkformer::cuda_op_launch

namespace darkformer {

void LimitCudaOpBlocksForTesting(int64_t blocks) { cuda_op_launch::blocks_for_testing = blocks; }

}  // namespace darkformer
