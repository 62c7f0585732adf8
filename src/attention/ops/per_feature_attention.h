// Positive-feature attention with the per-feature stabiliser (docs/kernels.md, "The normaliser
// at any scale"): the normaliser is at least 1 in shifted units for any finite input, so neither
// the output nor any gradient can overflow, and no floor is needed. With a_t = log phi(x_t) and
// l_j = log phi(y_j) (m features each):
//   R_i(t) = max_{j <= t} l_ji          per-feature key prefix max (causal)
//   s_t    = max_i (a_ti + R_i(t))      query shift (causal: reads keys j <= t only)
//   n_t    = sum_{j <= t} sum_i exp(a_ti + l_ji - s_t) [v_j, 1],   out_t = n_t[:D] / n_t[D]
// Every exponent is <= 0 (l_ji <= R_i(t)), and the i attaining s_t contributes its key j* with
// l_j*i = R_i(t) an exact 1: n_t[D] >= 1.
// In chunks: keys before the chunk live in a state S_i = sum_j exp(l_ji - R_i(e)) [v_j, 1] per
// feature, relative to the per-feature max R_i(e) at the end of the previous chunk (Z_i >= 1);
// when R grows, row i of S decays by exp(R_i(e) - R_i(e')) <= 1 (gated linear attention with a
// vector gate). Queries read it with exp(a_t + R(e) - s_t) <= 1. Inside a chunk every pair
// (t, j <= t) is summed over features elementwise: C x C x m exponentials per chunk, which is
// why this is the composite reference (`op: naive`); the fast forms split the chunk in
// sub-chunks (per_feature_chunks.h, raw_cpu_kernel.h).
//
// Shape legend: B batch, H heads, L positions, M features, D value dim.
#pragma once

#include <torch/torch.h>

#include "attention/ops/feature_map.h"

namespace darkformer {

// a_BHLM, l_BHLM: log-features of queries and keys (keys already per query head), fp32 or fp64;
// v_BHLD in the same dtype. Differentiable through a, l and v (the shifts are detached: the
// output is exactly invariant to them). causal false: every key for every query, R_i the max over
// all keys.
torch::Tensor PerFeatureLinearAttention(const torch::Tensor& a_BHLM, const torch::Tensor& l_BHLM,
                                        const torch::Tensor& v_BHLD, bool causal, int64_t chunk_size);

}  // namespace darkformer
