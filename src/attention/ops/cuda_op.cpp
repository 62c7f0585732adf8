// op: cuda (see cuda_op.h).
#include "attention/ops/cuda_op.h"

#include <algorithm>
#include <atomic>

#include "attention/ops/chunk_common.h"
#include "attention/ops/cuda_op_device.h"
#include "attention/ops/cuda_op_launch.h"
#include "attention/ops/cuda_scan.h"
#include "attention/ops/dtype_probe.h"
#include "attention/ops/feature_gradients.h"
#include "attention/ops/fp32_products.h"
#include "attention/ops/saved_bytes.h"
#include "util/error.h"
#include "util/mixed_precision.h"

#ifdef DARKFORMER_CUDA_OP
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace darkformer {

namespace {

using cuda_op_launch::BackwardBlocks;
using cuda_op_launch::Carries;
using cuda_op_launch::ChunkingFor;
using cuda_op_launch::EnterSegment;
using cuda_op_launch::ForwardBuffers;
using cuda_op_launch::MakeLaunch;
using cuda_op_launch::MakeScanFeatures;
using cuda_op_launch::Pass;
using cuda_op_launch::PerSegment;
using cuda_op_launch::PointFeatures;
using cuda_op_launch::Scratch;
using cuda_op_launch::Unwritten;

std::atomic<bool> emulate_on_host{false};

// `host(launch)` for CPU tensors (the emulation), else `device(launch, stream)` on `on`'s device.
template <typename Host, typename Device>
void Dispatch(const torch::Tensor& on, Host host, Device device) {
  if (on.is_cpu()) {
    host();
    return;
  }
#ifdef DARKFORMER_CUDA_OP
  const c10::cuda::CUDAGuard guard(on.device());
  device(c10::cuda::getCurrentCUDAStream(on.device().index()).stream());
#else
  Fail("op: cuda: this build has no CUDA kernels (CMake found no nvcc)");
#endif
}

enum class Step { kForward, kStates, kQuerySide, kKeySide };
void Run(const cuda_scan::Launch& x, const torch::Tensor& on, Step step) {
  Dispatch(
      on,
      [&] {
        if (step == Step::kForward) cuda_scan::ForwardOnHost(x);
        if (step == Step::kStates) cuda_scan::StatesOnHost(x);
        if (step == Step::kQuerySide) cuda_scan::QuerySideOnHost(x);
        if (step == Step::kKeySide) cuda_scan::KeySideOnHost(x);
      },
      [&](void* stream) {
        if (step == Step::kForward) cuda_scan::ForwardOnDevice(x, stream);
        if (step == Step::kStates) cuda_scan::StatesOnDevice(x, stream);
        if (step == Step::kQuerySide) cuda_scan::QuerySideOnDevice(x, stream);
        if (step == Step::kKeySide) cuda_scan::KeySideOnDevice(x, stream);
      });
}

// Where op: cuda may run: a CUDA device in a build with its kernels, or the host emulation in tests.
void CheckWhere(const torch::Tensor& x) {
  DF_CHECK(x.is_cuda() || (x.is_cpu() && emulate_on_host),
           "op: cuda runs on a CUDA device; got inputs on " << x.device() << " (op: auto picks this device's form)");
  DF_CHECK(x.is_cpu() || cuda_scan::DeviceKernelsBuilt(),
           "op: cuda: this build has no CUDA kernels (CMake found no nvcc); use op: auto");
  if (x.is_cuda()) {
    const auto problem = CudaOpDeviceProblem(x.get_device());
    DF_CHECK(problem.empty(), "op: cuda: " << problem);
  }
  DF_CHECK(x.scalar_type() != torch::kFloat64, "op: cuda computes in fp32; got fp64 inputs (op: auto takes them)");
}

// Whether the scan's matrix products run on tensor cores, their operands split (cuda_scan_matmul.h): for
// queries that arrived in a 16-bit type (what users train in, under autocast or not), and for fp32
// ones where LibTorch lets its own fp32 matrix products use TF32 (torch.backends.cuda.matmul's
// setting), so fp32 means fp32 unless the user chose otherwise.
bool TensorCores(const FeatureMap& map) {
  const auto dtype = map.input_dtype;
  return dtype == torch::kBFloat16 || dtype == torch::kHalf ||
         (dtype == torch::kFloat32 && at::globalContext().allowTF32CuBLAS());
}

// A tensor the scan reads as given where it is fp32 or bf16 (its loads convert), else its fp32 copy.
torch::Tensor AsRead(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kBFloat16 ? t : t.to(torch::kFloat32);
}

// The output's dtype: bf16 values' (what the kernels convert it to: the scan rounds it as
// LibTorch does, so the incoming gradient is bf16 too), else fp32.
torch::ScalarType OutputDtype(const torch::Tensor& v) {
  return v.scalar_type() == torch::kBFloat16 ? torch::kBFloat16 : torch::kFloat32;
}

// One call's scan over its inputs as given: the features it reads (given, or projected inside:
// MakeScanFeatures), the values as given (AsRead), the document ids on the device, and the Launch
// pointing to them (these tensors keep what it points to alive); `options`: fp32 on its device. The forward and the backward, which reruns
// the forward's first steps, set up the same but for their segments (cuda_op_launch::SegmentChunks).
struct CallScan {
  cuda_op_launch::ScanFeatures features;
  torch::Tensor values, ids, resets;
  torch::TensorOptions options;
  cuda_scan::Launch launch;
  CallScan(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x, const torch::Tensor& y,
           const torch::Tensor& v, int64_t rows, int64_t chunk, const torch::Tensor& document_ids_BL,
           bool tensor_cores, Pass pass)
      : features(MakeScanFeatures(map, p, x, y, rows)),
        values(AsRead(v)),
        options(v.options().dtype(torch::kFloat32)) {
    const auto cut = ChunkingFor(chunk, map.sub_chunk);
    launch = MakeLaunch(x.size(1), rows, FeatureCount(), values, cut.sub, cut.chunk_subs, document_ids_BL, ids, resets,
                        pass, map.segment_chunks);
    PointFeatures(launch, features);
    launch.tensor_cores = tensor_cores;
    launch.factor_pairs = !map.exponential_pairs;
  }
  // m: the keys' projection's width, or their given features'.
  int64_t FeatureCount() const { return features.KeysInside() ? features.proj.size(2) : features.l.size(3); }
};

// The scan's backward: the queries' QueryGradients (d/d(natural-log) of their features, or d x' at
// their mapped input where the scan projects them), d/d(natural-log) of the key features and dL/dv
// per key row, or per KV head (dv_per_kv_head) where the key rows of a KV head add theirs into one
// buffer (cuda_scan::DvShared). The features, the recomputed states, Z and the scratch live only
// here, so they are freed before the features' own backward runs.
struct ScanGradients {
  torch::Tensor dq, dl, dv;
  bool queries_mapped = false, dv_per_kv_head = false;
};

ScanGradients ScanBackward(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                           const torch::Tensor& y, int64_t rows, const torch::Tensor& v, const torch::Tensor& den,
                           const torch::Tensor& grad, int64_t chunk,
                           const torch::Tensor& document_ids_BL, bool tensor_cores) {
  CallScan scan(map, p, x, y, v, rows, chunk, document_ids_BL, tensor_cores, Pass::kBackward);
  auto& launch = scan.launch;
  const auto& on = scan.values;  // on the call's device
  const auto options = scan.options;
  // One segment's states entering its chunks, recomputed (the forward's first two steps), then,
  // once the query side has read them, its reverse states in the same buffer (z); one scratch for
  // both sides.
  launch.backward_blocks = BackwardBlocks(launch, on);
  const auto states = PerSegment(launch, true, options), refs = PerSegment(launch, false, options);
  launch.states = states.data_ptr<float>();
  launch.refs = refs.data_ptr<float>();
  launch.z = launch.states;
  const auto scratch = Scratch(launch, /*backward=*/true, options);
  // Where a row takes several segments, the state entering each but the first, from a first pass
  // over them in order (carry slot s - 1 enters segment s); the second pass takes them from the
  // last, each starting from its own.
  const int64_t segments = launch.Segments();
  const Carries entering(launch, std::max<int64_t>(segments - 1, 0), options);
  for (int64_t s = 0; s + 1 < segments; ++s) {
    EnterSegment(launch, s, s - 1, s);
    Run(launch, on, Step::kStates);
  }
  // As it comes, at its strides (bf16 where the output was: OutputDtype): a transposed view or a
  // broadcast costs no copy.
  const auto g = AsRead(grad);
  const bool mapped = scan.features.QueriesInside();
  const int64_t per_query = mapped ? launch.mapped_dim : launch.features;
  launch.dv_shared = cuda_scan::DvShared(launch.value_rows_per, at::globalContext().deterministicAlgorithms());
  ScanGradients result{Unwritten({x.size(0), x.size(1), launch.length, per_query}, options),
                       Unwritten({x.size(0), rows, launch.length, launch.features}, options),
                       launch.dv_shared ? torch::zeros({x.size(0), v.size(1), launch.length, launch.value_dim}, options)
                                        : Unwritten({x.size(0), rows, launch.length, launch.value_dim}, options),
                       mapped, launch.dv_shared};
  const auto dot = Unwritten(den.sizes(), den.options());  // g_t . out_t, from the query side to the key side
  launch.dot = dot.data_ptr<float>();
  launch.den = den.data_ptr<float>();
  launch.g = g.data_ptr();
  launch.g_bf16 = g.scalar_type() == torch::kBFloat16;
  for (int i = 0; i < 4; ++i) launch.g_strides[i] = g.stride(i);
  launch.dq = result.dq.data_ptr<float>();
  launch.dl = result.dl.data_ptr<float>();
  launch.dv = result.dv.data_ptr<float>();
  // Each sub-chunk's entering reference, from the query side to the key side (m floats each).
  const auto sub_refs = Unwritten({launch.rows * launch.Segment() * launch.group_subs, launch.features}, options);
  launch.sub_refs = sub_refs.data_ptr<float>();
  // The reverse state at the start of the segment the key side just took, for the one before it
  // (the reverse scan reads and replaces it).
  const auto passed = segments > 1 ? Unwritten({launch.rows, launch.features, launch.value_dim + 1}, options)
                                   : torch::Tensor();
  if (passed.defined()) launch.z_carry = passed.data_ptr<float>();
  for (int64_t s = segments - 1; s >= 0; --s) {
    EnterSegment(launch, s, s - 1, /*leave=*/-1);
    Run(launch, on, Step::kStates);
    // The query side consumes the states (the key side never reads them); the reverse states take
    // their place.
    Run(launch, on, Step::kQuerySide);
    Run(launch, on, Step::kKeySide);
  }
  return result;
}

// Saves x, y and v as given (O(L D); bf16 ones are the caller's own tensors, not fp32 copies) and
// the normaliser; the backward recomputes the features, the states entering the chunks and the
// output in fp32 (Cotangents).
class CudaScanFunction : public torch::autograd::Function<CudaScanFunction> {
 public:
  // Document ids ride as a non-tensor argument: an undefined tensor cannot be an autograd input.
  struct Documents {
    torch::Tensor ids_BL;
  };

  // x B x H x L x D, y B x K x L x D, v B x K x L x Dv, fp32 or 16-bit (computed in fp32); rows: K,
  // or H where key features are per query head.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& y,
                               const torch::Tensor& v, at::TensorList params, const FeatureMap& map, int64_t rows,
                               int64_t chunk, const Documents& documents, bool tensor_cores) {
    // LibTorch's products here (the key norms, A W^T) in plain fp32 under a run's TF32: no split
    // operands beside L x D tensors (fp32_products.h); the scan's own follow tensor_cores.
    NoTf32Scope fp32_products;
    const std::vector<torch::Tensor> p(params.begin(), params.end());
    CallScan scan(map, p, x, y, v, rows, chunk, documents.ids_BL, tensor_cores, Pass::kForward);
    auto& launch = scan.launch;
    const auto& on = scan.values;  // on the call's device
    const auto options = scan.options;
    // The output in the caller's dtype only (OutputDtype): the backward recomputes the fp32 one.
    const auto out = Unwritten({x.size(0), x.size(1), launch.length, launch.value_dim},
                                  options.dtype(OutputDtype(v)));
    auto den = Unwritten({x.size(0), x.size(1), launch.length}, options);
    const ForwardBuffers buffers(launch, options);
    if (out.scalar_type() == torch::kBFloat16) {
      launch.out16 = static_cast<uint16_t*>(out.data_ptr());
    } else {
      launch.out = out.data_ptr<float>();
    }
    launch.den = den.data_ptr<float>();
    // Segment by segment, each from the state the one before left in the carry slot.
    for (int64_t s = 0; s < launch.Segments(); ++s) {
      EnterSegment(launch, s, s > 0 ? 0 : -1, /*leave=*/0);
      Run(launch, on, Step::kForward);
    }
    // What it computed in (kernel-check's computes_in; the bf16 tests): fp32 throughout (the
    // features inside the scan: its fp32 scratch).
    RecordDtype(ProbeField::kInputs, buffers.scratch);
    RecordDtype(ProbeField::kFeatures, scan.features.KeysInside() ? scan.features.norms : scan.features.l);
    RecordDtype(ProbeField::kState, buffers.states);
    RecordDtype(ProbeField::kNormaliser, den);
    std::vector<torch::Tensor> saved = {x, y, v, den};  // the inputs as given
    saved.insert(saved.end(), p.begin(), p.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["tensor_cores"] = tensor_cores;
    SaveFeatureMap(ctx, map);
    if (documents.ids_BL.defined()) ctx->saved_data["documents"] = documents.ids_BL;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    NoAutocastGuard no_autocast;
    // The features' backward in plain fp32 (as the forward's): a split of its L x m and L x D
    // operands would hold four more of them at once.
    NoTf32Scope fp32_products;
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &y = saved[1], &v = saved[2];
    const std::vector<torch::Tensor> p(saved.begin() + 4, saved.end());
    const FeatureMap& map = SavedFeatureMap(ctx);
    const int64_t rows = ctx->saved_data["rows"].toInt();
    const auto documents = ctx->saved_data.find("documents");
    auto scan = ScanBackward(map, p, x, y, rows, v, saved[3], grads[0],
                                   ctx->saved_data["chunk"].toInt(),
                                   documents != ctx->saved_data.end() ? documents->second.toTensor() : torch::Tensor(),
                                   ctx->saved_data["tensor_cores"].toBool());
    // d log phi, natural log: the scan's sums are already those (the exponentials are the same numbers).
    grads.clear();  // the incoming gradient (as fp32) is not needed beyond the scan
    // dv per KV head before the features' backward runs: its rows are not held through it.
    auto dv = scan.dv_per_kv_head ? std::move(scan.dv) : causal_ops::PerKvHead(scan.dv, v.size(1));
    scan.dv = torch::Tensor();
    // The keys as given where the queries are mapped (their backward takes them by KV head).
    const auto features =
        scan.queries_mapped
            ? causal_ops::FeatureBackwardFromMappedQueries(map, p, x, y, std::move(scan.dq), std::move(scan.dl))
            : causal_ops::FeatureBackward(map, p, x, causal_ops::PerRow(y, rows), std::move(scan.dq), std::move(scan.dl));
    // dy: FeatureBackwardFromMappedQueries gives dx in x's dtype (autograd's own conversion, early).
    RecordDtype(ProbeField::kGradients, features.dy);
    // Autograd brings each gradient to its input's dtype.
    torch::autograd::variable_list result = {features.dx, causal_ops::PerKvHead(features.dy, y.size(1)),
                                             std::move(dv)};
    for (const auto& pg : features.params) result.push_back(pg);
    result.push_back({});  // map
    result.push_back({});  // rows
    result.push_back({});  // chunk
    result.push_back({});  // documents
    result.push_back({});  // tensor_cores
    return result;
  }
};

}  // namespace

void EmulateCudaOpOnHostForTesting(bool emulate) { emulate_on_host = emulate; }

bool CudaOpBuilt() { return cuda_scan::DeviceKernelsBuilt(); }

int64_t CudaOpSavedBytes(const torch::Tensor& out) {
  return causal_ops::SavedBytesOf<CudaScanFunction>(out);
}

torch::Tensor CudaCausalAttention(const torch::Tensor& x_BHLD, const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD,
                                  const FeatureMap& map, int64_t chunk_size, const torch::Tensor& document_ids_BL) {
  CheckWhere(x_BHLD);
  DF_CHECK(x_BHLD.dim() == 4 && y_BKLD.dim() == 4 && v_BKLD.dim() == 4 && x_BHLD.size(1) % y_BKLD.size(1) == 0 &&
               v_BKLD.size(1) == y_BKLD.size(1) && y_BKLD.size(2) == x_BHLD.size(2) && v_BKLD.size(2) == x_BHLD.size(2),
           "op: cuda: shapes do not match: x " << x_BHLD.sizes() << ", y " << y_BKLD.sizes() << ", v " << v_BKLD.sizes());
  const int64_t heads = x_BHLD.size(1), kv_heads = y_BKLD.size(1);
  // Keys once per KV head, or per query head where the map's parameters are.
  const int64_t rows = map.keys_per_query_head ? heads : kv_heads;
  const int64_t chunk = std::max<int64_t>(1, std::min(chunk_size, x_BHLD.size(2)));
  return CudaScanFunction::apply(x_BHLD, y_BKLD, v_BKLD, at::TensorList(map.params), map, rows, chunk,
                                 CudaScanFunction::Documents{document_ids_BL}, TensorCores(map));
}

std::pair<torch::Tensor, torch::Tensor> CudaPrefillState(const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD,
                                                          const FeatureMap& map, int64_t num_query_heads,
                                                          int64_t chunk_size) {
  CheckWhere(y_BKLD);
  torch::NoGradGuard no_grad;
  NoAutocastGuard no_autocast;
  const auto y = y_BKLD.to(torch::kFloat32), v = v_BKLD.to(torch::kFloat32).contiguous();
  const int64_t batch = y.size(0), kv_heads = y.size(1), rows = map.keys_per_query_head ? num_query_heads : kv_heads;
  // The keys' own log-features (the recurrent step's: nothing dropped), base 2; the queries' side
  // is not read, so the keys stand in for it.
  const auto l = (map.log_features(causal_ops::PerRow(y, rows), map.params, /*is_query=*/false).to(torch::kFloat32) *
                  causal_ops::kLog2E)
                     .contiguous();
  const int64_t chunk = std::max<int64_t>(1, std::min(chunk_size, y.size(2)));
  torch::Tensor ids, resets;
  const auto cut = ChunkingFor(chunk, map.sub_chunk);
  auto launch =
      MakeLaunch(rows, rows, l.size(3), v, cut.sub, cut.chunk_subs, torch::Tensor(), ids, resets, Pass::kPrefill);
  launch.l = l.data_ptr<float>();
  launch.a = l.data_ptr<float>();  // never read: a prefill folds keys only
  launch.tensor_cores = TensorCores(map);
  const auto options = l.options();
  launch.through_row_end = true;  // the state after the whole row, in the last slot
  const ForwardBuffers buffers(launch, options);
  EnterSegment(launch, 0, /*enter=*/-1, /*leave=*/0);
  Run(launch, l, Step::kStates);
  const auto final_states = buffers.carry.states.select(1, 0);
  auto final_refs = buffers.carry.refs.select(1, 0);
  // recurrent_step.h's layout: B x K x F x m (x V), F = rows per KV head; its reference in nats.
  const int64_t per_kv = rows / kv_heads;
  return {final_states.view({batch, kv_heads, per_kv, launch.features, launch.value_dim + 1}),
          final_refs.mul_(1.0 / causal_ops::kLog2E).view({batch, kv_heads, per_kv, launch.features})};
}

}  // namespace darkformer
