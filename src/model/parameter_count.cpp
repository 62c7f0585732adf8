// Parameter counts per component (see parameter_count.h), asked of the model built for its shapes.
#include "model/parameter_count.h"

#include "model/gemma_model.h"
#include "util/shapes_only.h"

namespace darkformer {

namespace {

bool Contains(const std::string& name, const char* part) { return name.find(part) != std::string::npos; }

}  // namespace

ParameterCounts CountParameters(const GemmaConfig& config, const AttentionConfig& attention) {
  ShapesOnlyScope shapes_only;  // a 7B model costs nothing (util/shapes_only.h)
  GemmaModel model(config, attention);
  ParameterCounts c;
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const int64_t n = item.value().numel();
    if (name == "embed_tokens.weight") {
      c.embedding += n;
    } else if (Contains(name, ".self_attn.kernel.")) {
      c.kernel += n;
    } else if (Contains(name, ".self_attn.")) {  // q/k/v/o projections, Gemma 3's q/k norms
      c.attention += n;
    } else if (Contains(name, ".mlp.")) {
      c.mlp += n;
    } else {  // the block norms and the final norm
      c.norms += n;
    }
  }
  return c;
}

}  // namespace darkformer
