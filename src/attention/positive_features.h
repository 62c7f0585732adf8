// Positive random features (000 eq. 1, Lemma 2.1; FAVOR+): phi(x) = exp(Wx - |x|^2/2) / sqrt(m),
// so E[phi(x).phi(y)] = exp(x.y), plus the causal-safe stabilisation used by the kernels.
//
// Shape legend: B batch, H heads, L positions, D input dim, M random features.
//
// Stabilisers. The positive kernels' attention is computed from log phi (log_feature_kernel.h)
// with the per-feature stabiliser in every form (ops/per_feature_attention.h, the composite
// reference; ops/per_feature_chunks.h and ops/raw_cpu_kernel.h, the fast forms): normaliser >= 1
// at any scale. The split below (queries shifted by their own row max, which cancels; keys split
// as phi(y_j) = exp(b_j) psi_j with b_j = max_m log phi(y_j)_m carried as a log-weight against
// its causal prefix max) is the older scalar stabiliser, kept for tests of LinearAttention. Shifts are detached: the
// output is invariant to them, so the gradient is unchanged.
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
