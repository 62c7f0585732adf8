// Packed windows of several documents (data.document_masking). A row's documents are numbered in
// order: document_ids_BL[b, t] is the document of position t, nondecreasing along the row, and a
// document starts where the id changes (the position after a separator token, EOS, and the
// window's first position). Attention then stays inside a document: position i attends to j only
// if j <= i and both lie in one document, and every running state (key-value sums, normaliser,
// stabiliser) starts empty at a document's first position, as if each document ran alone.
//
// Shape legend: B batch, H query heads, K key/value heads, L positions, D head dim.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace darkformer {

// Document ids of packed token rows: ids[b, t] = the number of `separator_id` tokens in row b
// before position t (a separator ends its document; the next position starts the next one).
torch::Tensor DocumentIdsFromTokens(const torch::Tensor& input_ids_BL, int64_t separator_id);

// Each position's index inside its own document (RoPE positions that restart per document): BL int64.
torch::Tensor PositionsInDocument(const torch::Tensor& document_ids_BL);

// Throws, naming the tensor, unless ids are int64 B x L (nondecreasing along each row is checked
// where the ids are read on the host: DocumentSpans).
void CheckDocumentIds(const torch::Tensor& document_ids_BL, int64_t batch, int64_t length);

// Whether positions i and j lie in one document: B x 1 x L x L bool (broadcast over heads).
torch::Tensor SameDocument(const torch::Tensor& document_ids_BL);

// The documents of each row, read on the host: {start, length} in order. Throws when a row's ids
// decrease.
struct DocumentSpan {
  int64_t start = 0, length = 0;
  bool operator==(const DocumentSpan& o) const { return start == o.start && length == o.length; }
};
std::vector<std::vector<DocumentSpan>> DocumentSpans(const torch::Tensor& document_ids_BL);

// Attention run on each document alone and joined along L: out[b, :, span] = fn(q, k, v of that
// span of row b). Rows with the same documents share one call per document. The reference every
// masked form is tested against, and the path of forms without a masked operator of their own.
using AttentionFn = std::function<torch::Tensor(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD,
                                                const torch::Tensor& v_BKLD)>;
torch::Tensor PerDocument(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD,
                          const torch::Tensor& document_ids_BL, const AttentionFn& fn);

}  // namespace darkformer
