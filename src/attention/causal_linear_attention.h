// Linear attention from features given as values (001: D^-1 (phi(Q) (phi(K)^T V)); 000 eq. 2): the
// signed kernels' path (trig, slay, flexformer). Positive kernels pass log-features to
// ops/per_feature_attention.h instead, whose normaliser cannot underflow.
// out_i = sum_j a_ij v_j / sum_j a_ij with a_ij = q_i.k_j * exp(b_j), j <= i when causal.
// The causal path is chunked: an explicit masked product inside each chunk plus a running state
// of sum_j exp(b_j - R) k_j v_j^T and sum_j exp(b_j - R) k_j across chunks, so time is
// O(L * M * D) and no per-position state (L * M * D) is ever held.
//
// Shape legend: B batch, H heads, L positions, M features, D value dim, C chunk length.
#pragma once

#include <torch/torch.h>

namespace darkformer {

// query_features_BHLM, key_features_BHLM: non-negative features (see positive_features.h);
// key_log_scale_BHL: per-key log-weights b_j (an undefined tensor means zeros). The key weights
// are combined against the running max of b over positions <= i (causal-safe and exact).
// Sums run in the features' dtype (fp32, or fp64 for gradient checks); returns out_BHLD in it.
// signed_floor > 0: the features may be negative (trig), so the normaliser may cross zero; its
// magnitude is floored at signed_floor with its sign kept (no NaN, no sign flip).
torch::Tensor LinearAttention(const torch::Tensor& query_features_BHLM, const torch::Tensor& key_features_BHLM,
                              const torch::Tensor& key_log_scale_BHL, const torch::Tensor& v_BHLD, bool causal,
                              int64_t chunk_size, double signed_floor = 0.0);

}  // namespace darkformer
