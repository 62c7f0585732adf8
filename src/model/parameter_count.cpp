// Analytic parameter counts (see parameter_count.h).
#include "model/parameter_count.h"

#include "attention/kernel_registry.h"

namespace darkformer {

ParameterCounts CountParameters(const GemmaConfig& config, const AttentionConfig& attention) {
  ParameterCounts c;
  const int64_t e = config.hidden_size, layers = config.num_hidden_layers, d = config.head_dim;
  const int64_t h = config.num_attention_heads, kv = config.num_key_value_heads;
  c.embedding = config.vocab_size * e;
  const int64_t qk_norms = config.Family() == GemmaFamily::kGemma3 ? 2 * d : 0;
  c.attention = layers * (e * h * d + 2 * e * kv * d + h * d * e + qk_norms);
  c.mlp = layers * 3 * e * config.intermediate_size;
  const int64_t norms_per_layer = config.Family() == GemmaFamily::kGemma1 ? 2 : 4;
  c.norms = layers * norms_per_layer * e + e;
  for (int64_t i = 0; i < layers; ++i) {
    const std::string name = attention.KernelForLayer(i);
    KernelShape shape{h, d, i};
    const auto kernel = MakeAttentionKernel(name, shape, attention.OptionsFor(name));
    for (const auto& p : kernel->parameters()) c.kernel += p.numel();
  }
  return c;
}

}  // namespace darkformer
