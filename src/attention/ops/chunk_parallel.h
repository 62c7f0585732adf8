// Causal positive-feature attention over all chunks at once: the form CUDA runs, with a number
// of ops (kernel launches) that does not grow with the sequence length L. The math is the
// per-feature stabiliser of per_feature_chunks.h (normaliser >= 1 at any scale), every chunk's
// three parts in batched products; in chunks of C positions (N = ceil(L / C), the last one
// zero-padded: padded keys come after every real query, so they reach nothing real):
//   * each chunk's own state U_c = sum_{j in c} exp(l_j - R(e_c)) [v_j, 1]^T relative to its last
//     position's per-feature max, all chunks in one batched product;
//   * the state entering chunk c, S(e_{c-1}) = sum_{c' < c} exp(R(e_c') - R(e_{c-1})) U_c' per
//     feature: one product with the per-feature N x N decays, or for rows of more than 64 chunks
//     the same sums in blocks of ~sqrt(N) chunks (chunk_decays.h: m N^2 against ~2 m N^1.5 per key
//     row; a sequential scan would cost ops per chunk, a log-depth scan log N of them);
//   * the sub-chunk parts and the reads, per_feature_chunks.h.
// The backward is closed-form in the same shape: queries against the same terms, keys and values
// against the reverse states (the transposed decays), R and s held constant (out is exactly
// invariant to them). Saved for the backward: x, y, v, the output and its normaliser, O(L D);
// the terms are recomputed.
#pragma once

#include <torch/torch.h>

#include "attention/ops/feature_map.h"

namespace darkformer {

// x_BHLD, y_BKLD, v_BKLD in fp32 or fp64 (the caller converts, and excludes autocast) -> out_BHLD.
// document_ids_BL (document_mask.h), when defined: every sum stays inside a document, and the
// per-feature maxima restart at each document's first position (a boundary is a decay of -inf
// between chunks, a mask on every part inside one).
torch::Tensor ChunkParallelCausalAttention(const torch::Tensor& x_BHLD, const torch::Tensor& y_BKLD,
                                           const torch::Tensor& v_BKLD, const FeatureMap& map, int64_t chunk_size,
                                           const torch::Tensor& document_ids_BL = {});

// Bytes its autograd node holds for the backward; 0 when `out` was not produced by it.
int64_t ChunkParallelSavedBytes(const torch::Tensor& out);

}  // namespace darkformer
