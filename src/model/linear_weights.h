// Which parameters are the model's linear (matmul) weights: the q/k/v/o projections and the MLP's
// gate/up/down, all named "*_proj.weight" by GemmaModel. One rule for the trainer's bf16 storage
// of frozen weights, the memory estimate and the FLOP count (which adds the tied LM head).
#pragma once

#include <string>

namespace darkformer {

inline bool IsLinearWeight(const std::string& name) {
  static const std::string suffix = "_proj.weight";
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace darkformer
