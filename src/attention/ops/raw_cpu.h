// The raw CPU form (raw_cpu_kernel.h) inside the operator: which calls it takes, and one unit of
// key rows through it. The forward also writes each row's checkpoints of the key state
// and their per-feature references (states_1RS, refs_1RN), which the backward reads.
#pragma once

#include "attention/document_mask.h"
#include "attention/ops/chunk_loop.h"

namespace darkformer::causal_ops {

// Whether the raw kernel can run these features: positive, fp32, on a CPU whose exp2 loops run
// vectorised.
bool RawKernelRuns(const FeatureMap& map, const torch::Tensor& x);
// Whether the operator's non-parallel path takes the raw kernel (causal_form.h's rule): where it
// runs, for `op: auto`; always for `op: raw_cpu`, which is refused where it cannot run.
bool CpuKernelApplies(const FeatureMap& map, const torch::Tensor& x);
// The kernel's chunk: at most L (its buffers are sized by it).
int64_t KernelChunk(int64_t chunk_size, int64_t length);
// The documents each key row scans (data.document_masking): the kernel runs every document of a
// row alone, from an empty state, its checkpoints one after the other in the row's slots. Empty
// `spans`: each row is one document.
struct RowDocuments {
  std::vector<std::vector<DocumentSpan>> spans;  // by folded key row
  int64_t checkpoints = 0;                       // checkpoint slots per row
  // A row's documents: its own, or the whole row [0, length).
  std::vector<DocumentSpan> Of(int64_t row, int64_t length) const {
    return spans.empty() ? std::vector<DocumentSpan>{{0, length}} : spans.at(row);
  }
};
// document_ids_BL undefined: no documents; else each row of sequence b takes b's documents (the
// folded rows are b-major, `rows / batch` per sequence).
RowDocuments MakeRowDocuments(const torch::Tensor& document_ids_BL, int64_t rows, int64_t length, int64_t features,
                              int64_t chunk_size);

void ForwardUnitRaw(const std::vector<torch::Tensor>& p, const Layout& l, const torch::Tensor& x_1HLD,
                    const torch::Tensor& y_1KLD, const torch::Tensor& v_1KLD, int64_t chunk_size,
                    const torch::Tensor& out_1KGLD, const torch::Tensor& den_1KGL, const torch::Tensor& states_1RS,
                    const torch::Tensor& refs_1RN, const RowDocuments& documents, int64_t row0);
std::vector<torch::Tensor> BackwardUnitRaw(const std::vector<torch::Tensor>& params, const Layout& l,
                                           const UnitSaved& s, const torch::Tensor& states_1RS,
                                           const torch::Tensor& refs_1RN, int64_t chunk_size,
                                           const torch::Tensor& dx_1HLD, const torch::Tensor& dy_1KLD,
                                           const torch::Tensor& dv_1KLD, const RowDocuments& documents, int64_t row0);

}  // namespace darkformer::causal_ops
