// The recurrent form of causal positive-feature attention, one token at a time (decoding), and
// the state a prefill leaves: the running key state of state_fold.h per KV head (or query head).
#pragma once

#include <torch/torch.h>

#include "attention/ops/feature_map.h"

namespace darkformer {

// The recurrent form (one token at a time) for decoding, with the per-feature stabiliser of
// per_feature_attention.h: row i of the state is sum_{j <= t} exp(l_ji - R_i) [v_j, 1] per KV head
// (or query head, F = G), R_i = max_{j <= t} l_ji its feature's own running max. A new key raises
// R where it is larger and decays those rows by exp(R_old - R_new) <= 1; a query reads the state
// with exp(a_i + R_i - s), s = max_i (a_i + R_i): every factor <= 1 and the normaliser >= 1.
struct LinearAttentionState {
  torch::Tensor state_BKFMV;  // undefined before the first token
  torch::Tensor ref_BKFM;
  int64_t tokens = 0;
};

// Appends the token (y_BK1D, v_BK1D) to `state`, then attends from x_BH1D over every token so
// far (itself included): returns out_BH1D. Equal to FusedCausalLinearAttention's row t.
torch::Tensor LinearAttentionStep(LinearAttentionState& state, const torch::Tensor& x_BH1D,
                                  const torch::Tensor& y_BK1D, const torch::Tensor& v_BK1D, const FeatureMap& map);

// The state after the whole sequence (y_BKLD, v_BKLD), for a prefill followed by steps.
LinearAttentionState LinearAttentionPrefillState(const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD,
                                                 const FeatureMap& map, int64_t num_query_heads,
                                                 int64_t chunk_size);

}  // namespace darkformer
