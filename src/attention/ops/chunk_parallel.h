// Causal positive-feature attention over all chunks at once: the form CUDA runs, with a number
// of ops (kernel launches) that does not grow with the sequence length L.
//
// With l_j = log phi(y_j), b_j = max l_j, r_t = max_{j <= t} b_j (prefix max: causal) and the
// key features shifted by their own prefix max, k~_j = exp(l_j - r_j) in (0, 1]^m, the operator's
// stabilised sum (fused_causal_attention.h) is gated linear attention with a scalar log-decay
// g_t = r_{t-1} - r_t <= 0 (fla's "simple GLA"; the derivation is in docs/attention.md):
//   n_t = sum_{j <= t} (psi_t . k~_j) exp(r_j - r_t) [v_j, 1],   out_t = n_t[:D] / n_t[D].
// In chunks of C positions (N = ceil(L / C), the last one zero-padded: padded keys come after
// every real query, so they reach nothing real):
//   * intra-chunk: the C x C matrices (psi_t . k~_j) exp(r_j - r_t), j <= t, of every chunk in one
//     batched product;
//   * chunk states U_c = sum_{j in c} exp(l_j - r_{e_c}) [v_j, 1]^T (e_c: the chunk's last position),
//     all chunks in one batched product;
//   * inter-chunk: the state entering chunk c, S_{c-1} = sum_{c' < c} exp(r_{e_c'} - r_{e_{c-1}}) U_c',
//     one product with the strictly lower-triangular N x N decay matrix: 2 N^2 m (D+1) FLOPs per
//     key row, 8% of the forward's FLOPs at Gemma 2B's shape (G = 8, m = D = 256, C = 64) at
//     L = 8k and 27% at 32k (a larger chunk cuts it quadratically; a sequential scan would cost
//     2 ops per chunk, a log-depth scan log N ops);
//   * read: n_t += exp(r_{e_{c-1}} - r_t) psi_t^T S_{c-1}.
// Every exponent is <= 0. The backward is closed-form in the same shape (queries against the
// same products; keys and values against the reverse-time chunk states of psi h^T, decay matrix
// transposed), with r held constant (out is exactly invariant to it). Saved for the backward:
// x, y, v, the output and its normaliser, O(L D); features are recomputed.
#pragma once

#include <torch/torch.h>

#include "attention/ops/feature_map.h"

namespace darkformer {

// x_BHLD, y_BKLD, v_BKLD in fp32 or fp64 (the caller converts, and excludes autocast) -> out_BHLD.
// document_ids_BL (document_mask.h), when defined: every sum stays inside a document, and the
// stabiliser's reference restarts at each document's first position (a boundary is a decay of
// -inf between chunks, a block-diagonal mask inside one).
torch::Tensor ChunkParallelCausalAttention(const torch::Tensor& x_BHLD, const torch::Tensor& y_BKLD,
                                           const torch::Tensor& v_BKLD, const FeatureMap& map, int64_t chunk_size,
                                           const torch::Tensor& document_ids_BL = {});

// Bytes its autograd node holds for the backward; 0 when `out` was not produced by it.
int64_t ChunkParallelSavedBytes(const torch::Tensor& out);

}  // namespace darkformer
