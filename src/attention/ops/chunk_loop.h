// The chunk loop: causal positive-feature attention one chunk at a time in LibTorch ops, over
// one unit of key rows (causal_function.cpp splits the rows among threads), with the per-feature
// stabiliser of per_feature_chunks.h (its chunk math, one chunk per step). Between chunks the
// state S_i = sum_j exp(l_ji - R_i) [v_j, 1] per feature is carried, and when a feature's max
// grows its row decays by exp(R_old - R_new) <= 1. The backward runs two scans: queries in
// forward order against the state, keys and values in reverse order against the reverse state
// Z_c = T_{c+1} + exp(R(e_c) - R(e_{c+1})) Z_{c+1} (T_c = sum_{t in c} exp(a_t + R(e_{c-1}) - s_t) dL/dn_t^T);
// features are recomputed per chunk.
#pragma once

#include "attention/ops/chunk_common.h"

namespace darkformer::causal_ops {

// What the backward of one unit reads (views of the saved tensors and of the incoming gradient):
// nothing per feature (the backward recomputes R, the per-feature maxima, in its first scan).
struct UnitSaved {
  torch::Tensor x_1HLD, y_1KLD, v_1KLD, out_1KGLD, den_1KGL, g_1KGLD;
};

// Forward scan of one unit: writes out_1KGLD and den_1KGL (views into the outputs).
void ForwardUnit(const FeatureMap& map, const std::vector<torch::Tensor>& p, const Layout& l, const torch::Tensor& x_1HLD,
                 const torch::Tensor& y_1KLD, const torch::Tensor& v_1KLD, int64_t chunk_size, torch::Tensor out_1KGLD,
                 torch::Tensor den_1KGL);

// Backward of one unit: writes dx_1HLD, dy_1KLD, dv_1KLD and returns the gradients of its
// parameters (the unit's slices of per-head ones).
std::vector<torch::Tensor> BackwardUnit(const FeatureMap& map, const std::vector<torch::Tensor>& params, const Layout& l,
                                        const UnitSaved& s, int64_t chunk_size, torch::Tensor dx_1HLD,
                                        torch::Tensor dy_1KLD, torch::Tensor dv_1KLD);

}  // namespace darkformer::causal_ops
