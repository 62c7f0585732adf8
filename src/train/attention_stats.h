// Per-layer attention magnitudes of one batch, for spike events: the largest attention logit
// |s q.k| over the pairs a causal layer attends, and for random-feature kernels the largest log
// feature value log phi(sqrt(s) q), the quantity whose overflow makes feature attention blow up.
// Computed only when a spike is flagged (a forward pass without gradients).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "model/gemma_model.h"

namespace darkformer {

struct LayerAttentionStats {
  int64_t layer = 0;
  std::string kernel;            // the layer's kernel name
  double max_logit = 0.0;        // max |s q_i.k_j| over the pairs the layer attends
  double max_log_feature = 0.0;  // feature kernels: max log phi(sqrt(s) q); NaN for exact
};

std::vector<LayerAttentionStats> MeasureAttention(GemmaModelImpl& model, const torch::Tensor& input_ids_BL);

}  // namespace darkformer
