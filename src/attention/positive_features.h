// Positive random features (000 eq. 1, Lemma 2.1; FAVOR+): phi(x) = exp(Wx - |x|^2/2) / sqrt(m),
// so E[phi(x).phi(y)] = exp(x.y), plus the causal-safe stabilisation used by the kernels.
//
// Shape legend: B batch, H heads, L positions, D input dim, M random features.
//
// Stabiliser (why it is causal-safe). Attention with features normalises per query:
//   out_i = sum_j phi(x_i).phi(y_j) v_j / sum_j phi(x_i).phi(y_j).
// * Queries: any per-query factor cancels in that ratio, so each query row is shifted by its own
//   max over features, c_i = max_m log phi(x_i)_m (depends on x_i only).
// * Keys: a per-key factor does NOT cancel (it reweights keys), and the public Performer code's
//   max over all keys of the sequence lets a later key change earlier outputs numerically (a huge
//   later key underflows every earlier one). We instead split each key exactly as
//   phi(y_j) = exp(b_j) psi_j with b_j = max_m log phi(y_j)_m (depends on y_j only), psi_j in (0, 1],
//   and carry exp(b_j) as a per-key log-weight; causal_linear_attention.h combines keys against
//   the running (prefix) max of b, so nothing at position t depends on keys after t, and the result
//   is exact, not an approximation. Shifts are detached: the output is invariant to them, so the
//   gradient is unchanged.
#pragma once

#include <torch/torch.h>

namespace darkformer {

// The dtype features are computed in: fp64 for fp64 inputs (gradient checks), fp32 otherwise
// (bf16 / fp16 models keep features and running sums in fp32).
torch::ScalarType FeatureDtype(torch::ScalarType input);

// log phi(x) = x W^T - |x|^2/2 - log(m)/2 for x_BHLD and w_MD (shared) or w_HMD (per head).
torch::Tensor LogPositiveFeatures(const torch::Tensor& x_BHLD, const torch::Tensor& w);

// Query features shifted by their own row max (a per-query factor, cancels): values in (0, 1].
torch::Tensor StabilisedQueryFeatures(const torch::Tensor& log_phi_BHLM);

// Key features split as phi = exp(log_scale) * features with features in (0, 1].
struct KeyFeatures {
  torch::Tensor features_BHLM;
  torch::Tensor log_scale_BHL;
};
KeyFeatures StabilisedKeyFeatures(const torch::Tensor& log_phi_BHLM);

}  // namespace darkformer
