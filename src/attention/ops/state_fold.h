// The running key state of causal linear attention, S = sum_j exp(b_j - ref) k_j [v_j, 1]^T over
// the keys folded so far, ref their prefix max (000 eq. 2 in recurrent form; the causal-safe
// stabiliser of positive_features.h): every factor is <= 1, and nothing reads a later key. The
// one fold of the chunk loop (base-2 logs), the recurrent step, the prefill and the signed maps'
// decoding (natural logs);
// the raw CPU kernel runs the same fold in C, the naive reference its own, on purpose apart.
#pragma once

#include <torch/torch.h>

namespace darkformer::causal_ops {

struct KeyState {
  explicit KeyState(bool base2 = false) : base2(base2) {}
  KeyState(torch::Tensor s, torch::Tensor ref) : s_XMV(std::move(s)), ref_X(std::move(ref)) {}
  // X: any leading dims (1 x R x 1 in the chunk loop, B x K x F in the recurrent step); undefined
  // before the first key.
  torch::Tensor s_XMV, ref_X;
  bool base2 = false;  // b and ref are log2 (the chunk loop's exp2 path) instead of natural logs
  // Folds keys k_XCM with log-scales b_XC and values [v, 1] vh_XCV (X broadcastable) whose prefix
  // max at the last key is new_ref_X (>= ref_X).
  void Fold(const torch::Tensor& k_XCM, const torch::Tensor& b_XC, const torch::Tensor& vh_XCV,
            const torch::Tensor& new_ref_X);
  // The state as rows x M x V (the leading dims flattened).
  torch::Tensor Rows() const { return s_XMV.reshape({-1, s_XMV.size(-2), s_XMV.size(-1)}); }
};

}  // namespace darkformer::causal_ops
