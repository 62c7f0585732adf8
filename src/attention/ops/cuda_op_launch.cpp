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
#include "attention/ops/fp32_products.h"
#include "attention/ops/sub_chunk.h"
#include "util/error.h"

#ifdef DARKFORMER_CUDA_OP
#include <c10/cuda/CUDAGuard.h>
#endif

namespace darkformer::cuda_op_launch {

Chunking ChunkingFor(int64_t chunk, int64_t longest_sub) {
  const int64_t sub = causal_ops::SubChunk(chunk, longest_sub > 0 ? longest_sub : causal_ops::kMaxSubChunk);
  return {sub, std::max<int64_t>(1, chunk / sub)};
}

namespace {

// The per-chunk launches' blocks: as many as run at once on the device (more add only scratch),
// each taking several chunks in turn; the host emulation has no such limit unless a test sets one
// (LimitCudaOpBlocksForTesting, below).
std::atomic<int64_t> blocks_for_testing{0};
std::atomic<bool> shared_scratch_allowed{true};
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

int64_t SegmentChunks(int64_t rows, const torch::Tensor& on, bool backward) {
  const int64_t resident = ResidentBlocks(on, backward);
  return std::max<int64_t>(1, resident / rows + (resident % rows != 0 ? 1 : 0));
}

int64_t EvenSegment(int64_t most, int64_t chunks) {
  if (most <= 0 || chunks <= 0) return std::max<int64_t>(chunks, 1);
  const int64_t segments = chunks / most + (chunks % most != 0 ? 1 : 0);  // `most` may be the host's "no limit"
  return chunks / segments + (chunks % segments != 0 ? 1 : 0);
}

int64_t SegmentChunksHere(int64_t rows) {
  int64_t resident = blocks_for_testing;
#ifdef DARKFORMER_CUDA_OP
  if (resident == 0 && torch::cuda::is_available()) resident = cuda_scan::ResidentBlocks(/*backward=*/true);
#endif
  return resident > 0 ? std::max<int64_t>(1, resident / rows + (resident % rows != 0 ? 1 : 0)) : 0;
}

cuda_scan::Launch MakeLaunch(int64_t heads, int64_t rows, int64_t features, const torch::Tensor& v, int64_t sub,
                             int64_t group_subs, const torch::Tensor& document_ids_BL, torch::Tensor& ids,
                             torch::Tensor& resets, Pass pass, int64_t segment_chunks) {
  cuda_scan::Launch x;
  x.rows = v.size(0) * rows;
  x.rows_per_sequence = rows;
  x.length = v.size(2);
  x.features = features;
  x.value_dim = v.size(3);
  x.group = heads / rows;
  x.sub = sub;
  x.group_subs = group_subs;
  x.value_rows_per = rows / v.size(1);
  x.v = v.data_ptr();
  x.v_bf16 = v.scalar_type() == torch::kBFloat16;
  for (int i = 0; i < 4; ++i) x.v_strides[i] = v.stride(i);
  if (pass != Pass::kPrefill && x.rows > 0) {
    x.segment_chunks = segment_chunks > 0 ? segment_chunks
                                          : EvenSegment(SegmentChunks(x.rows, v, pass == Pass::kBackward), x.Chunks());
  }
  x.forward_blocks = std::max<int64_t>(1, std::min(x.rows * x.Segment(), ResidentBlocks(v, /*backward=*/false)));
  resets = Unwritten({x.rows * x.Segment()}, v.options().dtype(torch::kFloat32));
  x.resets = resets.data_ptr<float>();
  if (!document_ids_BL.defined()) return x;
  CheckDocumentIds(document_ids_BL, v.size(0), x.length);
  // No copy where the ids already live on the device as int64; never read on the host.
  ids = document_ids_BL.to(v.device(), torch::kInt64).contiguous();
  x.ids = ids.data_ptr<int64_t>();
  return x;
}

torch::Tensor Unwritten(at::IntArrayRef sizes, const torch::TensorOptions& options) {
  auto t = torch::empty(sizes, options);
  if (!t.is_cpu()) return t;
  // Written in place, not by fill_: a LibTorch op here would count as a launch (util/op_count.h).
  if (t.scalar_type() == torch::kBFloat16) {
    std::fill_n(static_cast<uint16_t*>(t.data_ptr()), t.numel(), uint16_t{0x7fc0});  // bf16's quiet NaN
  } else {
    std::fill_n(t.data_ptr<float>(), t.numel(), std::numeric_limits<float>::quiet_NaN());
  }
  return t;
}

// The backward's scratch in global memory is held to this many bytes by giving each row fewer blocks.
constexpr int64_t kBackwardScratchBytes = int64_t{256} << 20;

namespace {

bool ScratchInSharedMemory(const cuda_scan::Launch& x, bool backward, const torch::Device& on) {
  if (!on.is_cuda() || !shared_scratch_allowed) return false;
#ifdef DARKFORMER_CUDA_OP
  const c10::cuda::CUDAGuard guard(on);
  return cuda_scan::ScratchFitsInSharedMemory(x.ScratchFloats(backward));
#else
  return false;  // unreachable: CheckWhere refuses CUDA inputs in a build without the kernels
#endif
}

}  // namespace

int64_t BackwardBlocks(const cuda_scan::Launch& x, const torch::Tensor& on) {
  const int64_t resident = ResidentBlocks(on, /*backward=*/true);
  const int64_t per_row = resident / x.rows + (resident % x.rows != 0 ? 1 : 0);
  const int64_t budget = ScratchInSharedMemory(x, true, on.device())
                             ? per_row
                             : kBackwardScratchBytes / (x.rows * x.ScratchFloats(true) * 4);
  return std::max<int64_t>(1, std::min({x.Segment(), per_row, budget}));
}

torch::Tensor Scratch(cuda_scan::Launch& x, bool backward, const torch::TensorOptions& options) {
  x.scratch_shared[0] = ScratchInSharedMemory(x, false, options.device());
  x.scratch_shared[1] = backward && ScratchInSharedMemory(x, true, options.device());
  const int64_t forward = x.scratch_shared[0] ? 0 : x.forward_blocks * x.ScratchFloats(false);
  const int64_t back = !backward || x.scratch_shared[1] ? 0 : x.rows * x.backward_blocks * x.ScratchFloats(true);
  auto scratch = Unwritten({std::max(forward, back)}, options);
  x.scratch = scratch.numel() > 0 ? scratch.data_ptr<float>() : nullptr;
  return scratch;
}

torch::Tensor PerSegment(const cuda_scan::Launch& x, bool with_values, const torch::TensorOptions& options) {
  const int64_t slots = x.rows * (x.Segment() + 1);
  return with_values ? Unwritten({slots, x.features, x.value_dim + 1}, options)
                     : Unwritten({slots, x.features}, options);
}

Carries::Carries(cuda_scan::Launch& x, int64_t slots, const torch::TensorOptions& options)
    : states(Unwritten({x.rows, slots, x.features, x.value_dim + 1}, options)),
      refs(Unwritten({x.rows, slots, x.features}, options)) {
  x.carry_states = states.data_ptr<float>();
  x.carry_refs = refs.data_ptr<float>();
  x.carry_slots = slots;
}

void EnterSegment(cuda_scan::Launch& x, int64_t segment, int64_t enter, int64_t leave) {
  x.first_chunk = segment * x.Segment();
  x.enter_slot = enter;
  x.leave_slot = leave;
}

ForwardBuffers::ForwardBuffers(cuda_scan::Launch& x, const torch::TensorOptions& options)
    : states(PerSegment(x, true, options)),
      refs(PerSegment(x, false, options)),
      scratch(Scratch(x, false, options)),
      carry(x, 1, options) {
  x.states = states.data_ptr<float>();
  x.refs = refs.data_ptr<float>();
}

namespace {

bool ProjectedInside(const FeatureMap& map, const torch::Tensor& in) {
  return map.positive_features && (in.scalar_type() == torch::kFloat32 || in.scalar_type() == torch::kBFloat16);
}

// n = log2(e) |y'|^2 / 2 of the key rows (B x R x L) from y as given (B x K x L x D): y' = y A per
// query head, by KV head and its group (no keys repeated per head), or s y.
torch::Tensor KeyNorms(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& y,
                       int64_t rows) {
  const int64_t batch = y.size(0), kv_heads = y.size(1), length = y.size(2);
  const auto y32 = y.to(torch::kFloat32);
  torch::Tensor mapped;  // B x K x G' x L x R, G' = 1 or the query heads per KV head
  if (!map.input_map) {
    mapped = (y32 * map.input_scale).unsqueeze(2);
  } else {
    const auto a = p.at(1).detach().to(torch::kFloat32)[0];  // N x D x R
    if (a.size(0) == 1) {
      mapped = Fp32Matmul(y32, a[0]).unsqueeze(2);
    } else {
      DF_CHECK(a.size(0) == rows, "op: cuda: the input map has " << a.size(0) << " heads for " << rows << " key rows");
      mapped = Fp32Matmul(y32.unsqueeze(2), a.view({1, kv_heads, rows / kv_heads, a.size(1), a.size(2)}));
    }
  }
  const auto norms = (mapped * mapped).sum(-1).mul_(0.5 * causal_ops::kLog2E);
  return norms.expand({batch, kv_heads, rows / kv_heads, length}).reshape({batch, rows, length}).contiguous();
}

torch::Tensor BaseTwo(torch::Tensor log_features) { return log_features.mul_(causal_ops::kLog2E).contiguous(); }

}  // namespace

ScanFeatures MakeScanFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                              const torch::Tensor& y, int64_t rows) {
  torch::NoGradGuard no_grad;
  ScanFeatures f;
  // W that learns needs the queries' d log phi itself; an fp16 input would need its own loads; the
  // kernel's precompute_features asks for both sides' up front.
  const bool queries_inside = !map.precompute_features && ProjectedInside(map, x) && !p.at(0).requires_grad();
  const bool keys_inside = !map.precompute_features && ProjectedInside(map, y);
  if (queries_inside || keys_inside) {
    f.w = p[0].detach().to(torch::kFloat32).contiguous();
    const auto w_RM = f.w.t();
    f.proj = (map.input_map ? Fp32Matmul(p.at(1).detach().to(torch::kFloat32)[0], w_RM)
                            : (w_RM * map.input_scale).unsqueeze(0))
                 .mul_(causal_ops::kLog2E)
                 .contiguous();
  }
  if (queries_inside) {
    f.x = x;
  } else {
    f.a = BaseTwo(causal_ops::SideLogFeatures(map, p, x, torch::kFloat32, /*is_query=*/true));
  }
  if (keys_inside) {
    f.y = y;
    f.norms = KeyNorms(map, p, y, rows);
  } else {
    f.l = BaseTwo(causal_ops::SideLogFeatures(map, p, causal_ops::PerRow(y, rows), torch::kFloat32, /*is_query=*/false));
  }
  return f;
}

void PointFeatures(cuda_scan::Launch& launch, const ScanFeatures& f) {
  if (f.proj.defined()) {
    launch.dim = f.proj.size(1);
    launch.proj = f.proj.data_ptr<float>();
    launch.proj_per_head = f.proj.size(0) > 1;
  }
  if (f.QueriesInside()) {
    launch.x = f.x.data_ptr();
    launch.x_bf16 = f.x.scalar_type() == torch::kBFloat16;
    for (int i = 0; i < 4; ++i) launch.x_strides[i] = f.x.stride(i);
    launch.w = f.w.data_ptr<float>();
    launch.mapped_dim = f.w.size(1);
  } else {
    launch.a = f.a.data_ptr<float>();
  }
  if (f.KeysInside()) {
    launch.y = f.y.data_ptr();
    launch.y_bf16 = f.y.scalar_type() == torch::kBFloat16;
    for (int i = 0; i < 4; ++i) launch.y_strides[i] = f.y.stride(i);
    launch.key_norms = f.norms.data_ptr<float>();
  } else {
    launch.l = f.l.data_ptr<float>();
  }
}

}  // namespace darkformer::cuda_op_launch

namespace darkformer {

void LimitCudaOpBlocksForTesting(int64_t blocks) { cuda_op_launch::blocks_for_testing = blocks; }
void AllowCudaOpSharedScratchForTesting(bool allowed) { cuda_op_launch::shared_scratch_allowed = allowed; }

}  // namespace darkformer
