// The raw CPU form inside the operator (see raw_cpu.h).
#include "attention/ops/raw_cpu.h"

#include <algorithm>

#include "attention/ops/causal_form.h"
#include "attention/ops/fast_exp2.h"
#include "attention/ops/raw_cpu_kernel.h"

namespace darkformer::causal_ops {

bool RawKernelRuns(const FeatureMap& map, const torch::Tensor& x) {
  return map.positive_features && x.is_cpu() && x.scalar_type() == torch::kFloat32 && Exp2LoopsVectorised();
}

bool CpuKernelApplies(const FeatureMap& map, const torch::Tensor& x) {
  const bool applies = RawKernelRuns(map, x);
  DF_CHECK(map.op != CausalOp::kRawCpu || applies,
           "op: raw_cpu runs positive features in fp32 on a CPU with AVX2 only; got "
               << (map.positive_features ? "positive" : "another kernel's") << " features, " << x.scalar_type() << " on "
               << x.device() << (Exp2LoopsVectorised() ? "" : " without AVX2"));
  return ResolveCausalForm(map.op, x.is_cpu(), applies, /*documents=*/false) == CausalForm::kRawCpu;
}

// Every per-head block of a 1 x N x ... x L x W tensor is L contiguous rows (N's stride is free).
bool RowsContiguous(const torch::Tensor& t) {
  return t.stride(-1) == 1 && (t.dim() < 2 || t.size(-2) <= 1 || t.stride(-2) == t.size(-1));
}

bool AllRowsContiguous(std::initializer_list<torch::Tensor> tensors) {
  return std::all_of(tensors.begin(), tensors.end(), RowsContiguous);
}

// The kernel's chunk: at most L (its buffers are sized by it).
int64_t KernelChunk(int64_t chunk_size, int64_t length) { return std::max<int64_t>(1, std::min(chunk_size, length)); }

// The kernel's view of one key row of a unit (heads of the unit laid out as ForwardUnit's).
struct CpuRows {
  torch::Tensor w_MD, w2_DM;
  explicit CpuRows(const std::vector<torch::Tensor>& params) {
    w_MD = params.at(0).detach().to(torch::kFloat32).contiguous();
    w2_DM = (w_MD * kLog2E).t().contiguous();
  }
  // Positions [d.start, d.start + d.length) of key row `row`.
  PositiveRow Row(const Layout& l, const torch::Tensor& x_1HLD, const torch::Tensor& y_1KLD,
                  const torch::Tensor& v_1KLD, int64_t chunk_size, int64_t row, const DocumentSpan& d) const {
    return {d.length,
            x_1HLD.size(3),
            l.value_dim,
            w_MD.size(0),
            l.group,
            KernelChunk(chunk_size, d.length),
            w_MD.data_ptr<float>(),
            w2_DM.data_ptr<float>(),
            x_1HLD.data_ptr<float>() + row * l.group * x_1HLD.stride(1) + d.start * x_1HLD.stride(2),
            x_1HLD.stride(1),
            y_1KLD.data_ptr<float>() + row * y_1KLD.stride(1) + d.start * y_1KLD.stride(2),
            v_1KLD.data_ptr<float>() + row * v_1KLD.stride(1) + d.start * v_1KLD.stride(2)};
  }
};

RowDocuments MakeRowDocuments(const torch::Tensor& document_ids_BL, int64_t rows, int64_t length, int64_t features,
                              int64_t chunk_size) {
  RowDocuments documents;
  if (!document_ids_BL.defined()) {
    documents.checkpoints = CheckpointCount(length, features, KernelChunk(chunk_size, length));
    return documents;
  }
  const auto spans = DocumentSpans(document_ids_BL);
  const int64_t per_sequence = rows / static_cast<int64_t>(spans.size());
  for (int64_t row = 0; row < rows; ++row) {
    documents.spans.push_back(spans.at(row / per_sequence));
    int64_t count = 0;
    for (const auto& d : documents.spans.back()) count += CheckpointCount(d.length, features, KernelChunk(chunk_size, d.length));
    documents.checkpoints = std::max(documents.checkpoints, count);
  }
  return documents;
}

// ForwardUnit and BackwardUnit through the raw kernel, one key row at a time; the forward also
// writes each row's checkpoints of the key state and its per-feature reference (states_1RS,
// refs_1RN), which the backward reads.
void ForwardUnitRaw(const std::vector<torch::Tensor>& p, const Layout& l, const torch::Tensor& x_1HLD,
                    const torch::Tensor& y_1KLD, const torch::Tensor& v_1KLD, int64_t chunk_size,
                    const torch::Tensor& out_1KGLD, const torch::Tensor& den_1KGL, const torch::Tensor& states_1RS,
                    const torch::Tensor& refs_1RN, const RowDocuments& documents, int64_t row0) {
  DF_CHECK(AllRowsContiguous({x_1HLD, y_1KLD, v_1KLD, out_1KGLD, den_1KGL, states_1RS, refs_1RN}),
           "FusedCausalLinearAttention: the CPU kernel got a block of non-contiguous rows");
  const CpuRows rows(p);
  const int64_t features = rows.w_MD.size(0), state_floats = features * (l.value_dim + 1);
  for (int64_t row = 0; row < l.kv_heads; ++row) {
    int64_t checkpoint = 0;  // the row's slots its earlier documents took
    for (const auto& d : documents.Of(row0 + row, l.length)) {
      RunPositiveRowForward(rows.Row(l, x_1HLD, y_1KLD, v_1KLD, chunk_size, row, d),
                            {out_1KGLD.data_ptr<float>() + row * out_1KGLD.stride(1) + d.start * out_1KGLD.stride(3),
                             out_1KGLD.stride(2),
                             den_1KGL.data_ptr<float>() + row * den_1KGL.stride(1) + d.start * den_1KGL.stride(3),
                             den_1KGL.stride(2),
                             states_1RS.data_ptr<float>() + row * states_1RS.stride(1) + checkpoint * state_floats,
                             refs_1RN.data_ptr<float>() + row * refs_1RN.stride(1) + checkpoint * features});
      checkpoint += CheckpointCount(d.length, rows.w_MD.size(0), KernelChunk(chunk_size, d.length));
    }
  }
}

std::vector<torch::Tensor> BackwardUnitRaw(const std::vector<torch::Tensor>& params, const Layout& l,
                                           const UnitSaved& s, const torch::Tensor& states_1RS,
                                           const torch::Tensor& refs_1RN, int64_t chunk_size,
                                           const torch::Tensor& dx_1HLD, const torch::Tensor& dy_1KLD,
                                           const torch::Tensor& dv_1KLD, const RowDocuments& documents, int64_t row0) {
  DF_CHECK(AllRowsContiguous({s.x_1HLD, s.y_1KLD, s.v_1KLD, s.out_1KGLD, s.den_1KGL, s.g_1KGLD, dx_1HLD,
                              dy_1KLD, dv_1KLD, states_1RS, refs_1RN}),
           "FusedCausalLinearAttention: the CPU kernel's backward got a block of non-contiguous rows");
  c10::InferenceMode inference;
  const CpuRows rows(params);
  torch::Tensor dw_MD;
  if (params[0].requires_grad()) dw_MD = torch::zeros_like(rows.w_MD);
  const int64_t features = rows.w_MD.size(0), state_floats = features * (l.value_dim + 1);
  for (int64_t row = 0; row < l.kv_heads; ++row) {
    int64_t checkpoint = 0;
    for (const auto& d : documents.Of(row0 + row, l.length)) {
      // Row `row` of t at position d.start (dim 3 of 1 K G L X tensors, dim 2 of 1 K L X ones).
      auto at = [&](const torch::Tensor& t, int64_t position_dim) {
        return t.data_ptr<float>() + row * t.stride(1) + d.start * t.stride(position_dim);
      };
      RunPositiveRowBackward(rows.Row(l, s.x_1HLD, s.y_1KLD, s.v_1KLD, chunk_size, row, d),
                             {states_1RS.data_ptr<float>() + row * states_1RS.stride(1) + checkpoint * state_floats,
                              refs_1RN.data_ptr<float>() + row * refs_1RN.stride(1) + checkpoint * features,
                              at(s.out_1KGLD, 3), s.out_1KGLD.stride(2), at(s.den_1KGL, 3), s.den_1KGL.stride(2),
                              at(s.g_1KGLD, 3), s.g_1KGLD.stride(2),
                              dx_1HLD.data_ptr<float>() + row * l.group * dx_1HLD.stride(1) + d.start * dx_1HLD.stride(2),
                              dx_1HLD.stride(1), at(dy_1KLD, 2), at(dv_1KLD, 2),
                              dw_MD.defined() ? dw_MD.data_ptr<float>() : nullptr});
      checkpoint += CheckpointCount(d.length, rows.w_MD.size(0), KernelChunk(chunk_size, d.length));
    }
  }
  std::vector<torch::Tensor> param_grads(params.size());
  param_grads[0] = dw_MD.defined() ? dw_MD.to(params[0].scalar_type()) : dw_MD;
  return param_grads;
}

}  // namespace darkformer::causal_ops
