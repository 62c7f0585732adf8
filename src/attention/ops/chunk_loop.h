// The chunk loop: causal positive-feature attention one chunk at a time in LibTorch ops (~32 ops
// per chunk forward, ~77 backward), over one unit of key rows (causal_function.cpp splits the
// rows among threads). The math, with psi_i = exp(log phi(x_i) - c_i) (query, shifted by its row
// max c_i), k_j = exp(log phi(y_j) - b_j) and r_i = max_{j <= i} b_j:
//   n_i = sum_{j <= i} (psi_i.k_j) exp(b_j - r_i) [v_j, 1]    out_i = n_i[:D] / n_i[D]
// Backward, with g_i = dL/dout_i and gh_i = [g_i / n_i[D], -(g_i.out_i) / n_i[D]] = dL/dn_i:
//   dL/dpsi_i = sum_{j <= i} exp(b_j - r_i) (gh_i.[v_j,1]) k_j     (forward scan: state S)
//   dL/dk_j   = sum_{i >= j} exp(b_j - r_i) (gh_i.[v_j,1]) psi_i   (reverse scan: state R)
//   dL/d[v_j,1] = sum_{i >= j} (psi_i.k_j) exp(b_j - r_i) gh_i
// and the features' own backward (through the kernel's log phi) is recomputed per chunk.
#pragma once

#include "attention/ops/chunk_common.h"

namespace darkformer::causal_ops {

// What the backward of one unit reads (views of the saved tensors and of the incoming gradient).
struct UnitSaved {
  torch::Tensor x_1HLD, y_1KLD, v_1KLD, out_1KGLD, den_1KGL, r_1K1L, g_1KGLD;
};

// Forward scan of one unit: writes out_1KGLD, den_1KGL and r_1K1L (views into the outputs; r in
// base 2).
void ForwardUnit(const FeatureMap& map, const std::vector<torch::Tensor>& p, const Layout& l, const torch::Tensor& x_1HLD,
                 const torch::Tensor& y_1KLD, const torch::Tensor& v_1KLD, int64_t chunk_size, torch::Tensor out_1KGLD,
                 torch::Tensor den_1KGL, torch::Tensor r_1K1L);

// Backward of one unit: writes dx_1HLD, dy_1KLD, dv_1KLD and returns the gradients of its
// parameters (the unit's slices of per-head ones).
std::vector<torch::Tensor> BackwardUnit(const FeatureMap& map, const std::vector<torch::Tensor>& params, const Layout& l,
                                        const UnitSaved& s, int64_t chunk_size, torch::Tensor dx_1HLD,
                                        torch::Tensor dy_1KLD, torch::Tensor dv_1KLD);

}  // namespace darkformer::causal_ops
