// Parameter counts per component, of the model built for its shapes alone (util/shapes_only.h), so
// `inspect` can size a 7B model without allocating it.
#pragma once

#include <map>
#include <string>

#include "attention/attention_config.h"
#include "model/gemma_config.h"

namespace darkformer {

struct ParameterCounts {
  int64_t embedding = 0;   // token embedding, tied with the LM head
  int64_t attention = 0;   // q/k/v/o projections and Gemma 3's q/k norms, all layers
  int64_t mlp = 0;         // gate/up/down projections, all layers
  int64_t norms = 0;       // block norms and the final norm
  int64_t kernel = 0;      // attention kernels' own parameters (M, W, ...)
  int64_t Total() const { return embedding + attention + mlp + norms + kernel; }
};

ParameterCounts CountParameters(const GemmaConfig& config, const AttentionConfig& attention = {});

}  // namespace darkformer
