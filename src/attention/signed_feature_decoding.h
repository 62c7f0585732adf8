// The recurrent (decoding) form of linear attention with signed features (trig, slay,
// flexformer): running sums S = sum_j exp(b_j - r) f(k_j) [v_j, 1]^T per head with the key
// log-scales b_j referred to their running max r (rescaled down when it grows: causal-safe), and
// the normaliser's magnitude floored with its sign kept, as LinearAttention(signed_floor) does.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "attention/attention_kernel.h"

namespace darkformer {

// Appends T tokens (key features k_BHTM, log-scales b_BHT or undefined for none, values v_BHTD)
// one at a time, each read by its query features q_BHTM after its own key is in: out_BHTD.
torch::Tensor SignedFeatureDecode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTM,
                                  const torch::Tensor& k_BHTM, const torch::Tensor& b_BHT, const torch::Tensor& v_BHTD,
                                  double normaliser_floor);

}  // namespace darkformer
