// The running key state of the signed maps' decoding (signed_feature_decoding.h),
// S = sum_j exp(b_j - ref) k_j [v_j, 1]^T over the keys folded so far, ref the prefix max of their
// log-scales b (000 eq. 2 in recurrent form): every factor is <= 1, and nothing reads a later key.
// The positive maps keep a per-feature state instead (recurrent_step.h, per_feature_chunks.h).
#pragma once

#include <torch/torch.h>

namespace darkformer::causal_ops {

struct KeyState {
  KeyState() = default;
  KeyState(torch::Tensor s, torch::Tensor ref) : s_XMV(std::move(s)), ref_X(std::move(ref)) {}
  // X: any leading dims (1 x R x 1 in the chunk loop, B x K x F in the recurrent step); undefined
  // before the first key.
  torch::Tensor s_XMV, ref_X;
  // Folds keys k_XCM with log-scales b_XC and values [v, 1] vh_XCV (X broadcastable) whose prefix
  // max at the last key is new_ref_X (>= ref_X).
  void Fold(const torch::Tensor& k_XCM, const torch::Tensor& b_XC, const torch::Tensor& vh_XCV,
            const torch::Tensor& new_ref_X);
  // The state as rows x M x V (the leading dims flattened).
  torch::Tensor Rows() const { return s_XMV.reshape({-1, s_XMV.size(-2), s_XMV.size(-1)}); }
};

}  // namespace darkformer::causal_ops
