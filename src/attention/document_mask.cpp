// Document ids, masks and the per-document path (see document_mask.h).
#include "attention/document_mask.h"

#include "util/error.h"

namespace darkformer {

torch::Tensor DocumentIdsFromTokens(const torch::Tensor& input_ids_BL, int64_t separator_id) {
  DF_CHECK(input_ids_BL.dim() == 2, "document ids: input_ids must be [batch, length], got " << input_ids_BL.sizes());
  const auto ends_BL = input_ids_BL.eq(separator_id).to(torch::kLong);
  return ends_BL.cumsum(1).sub_(ends_BL);  // separators strictly before t
}

torch::Tensor PositionsInDocument(const torch::Tensor& document_ids_BL) {
  const int64_t length = document_ids_BL.size(1);
  const auto index_L = torch::arange(length, document_ids_BL.options());
  auto starts_BL = torch::ones_like(document_ids_BL, torch::kBool);
  if (length > 1) starts_BL.narrow(1, 1, length - 1).copy_(document_ids_BL.diff(1, 1).ne(0));
  // The start of t's document: the last start at or before t.
  const auto start_of_BL = std::get<0>(torch::where(starts_BL, index_L, torch::zeros_like(index_L)).cummax(1));
  return index_L - start_of_BL;
}

void CheckDocumentIds(const torch::Tensor& document_ids_BL, int64_t batch, int64_t length) {
  DF_CHECK(document_ids_BL.dim() == 2 && document_ids_BL.size(0) == batch && document_ids_BL.size(1) == length &&
               document_ids_BL.scalar_type() == torch::kLong,
           "document_ids must be int64 [batch " << batch << ", length " << length << "], got "
                                                << document_ids_BL.sizes() << " " << document_ids_BL.scalar_type());
}

torch::Tensor SameDocument(const torch::Tensor& document_ids_BL) {
  return document_ids_BL.unsqueeze(-1).eq(document_ids_BL.unsqueeze(-2)).unsqueeze(1);
}

std::vector<std::vector<DocumentSpan>> DocumentSpans(const torch::Tensor& document_ids_BL) {
  const auto ids = document_ids_BL.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t batch = ids.size(0), length = ids.size(1);
  const int64_t* p = ids.data_ptr<int64_t>();
  std::vector<std::vector<DocumentSpan>> spans(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* row = p + b * length;
    int64_t start = 0;
    for (int64_t t = 1; t <= length; ++t) {
      if (t < length) {
        DF_CHECK(row[t] >= row[t - 1], "document_ids of row " << b << " decrease at position " << t << " ("
                                                               << row[t - 1] << " then " << row[t]
                                                               << "): a row's documents must come in order");
        if (row[t] == row[t - 1]) continue;
      }
      spans[b].push_back({start, t - start});
      start = t;
    }
  }
  return spans;
}

torch::Tensor PerDocument(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD,
                          const torch::Tensor& document_ids_BL, const AttentionFn& fn) {
  CheckDocumentIds(document_ids_BL, q_BHLD.size(0), q_BHLD.size(2));
  const auto spans = DocumentSpans(document_ids_BL);
  auto run_rows = [&](int64_t first, int64_t rows, const std::vector<DocumentSpan>& docs) {
    if (docs.size() == 1) return fn(q_BHLD.narrow(0, first, rows), k_BKLD.narrow(0, first, rows), v_BKLD.narrow(0, first, rows));
    std::vector<torch::Tensor> outs;
    for (const auto& d : docs) {
      outs.push_back(fn(q_BHLD.narrow(0, first, rows).narrow(2, d.start, d.length),
                        k_BKLD.narrow(0, first, rows).narrow(2, d.start, d.length),
                        v_BKLD.narrow(0, first, rows).narrow(2, d.start, d.length)));
    }
    return torch::cat(outs, 2);
  };
  bool same = true;
  for (const auto& row : spans) same = same && row == spans.front();
  if (same) return run_rows(0, q_BHLD.size(0), spans.front());
  std::vector<torch::Tensor> rows;
  for (int64_t b = 0; b < q_BHLD.size(0); ++b) rows.push_back(run_rows(b, 1, spans[b]));
  return torch::cat(rows, 0);
}

}  // namespace darkformer
