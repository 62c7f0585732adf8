// The tiny Gemma the model-level tests build directly (no run config): vocab 96, hidden 32, 4 query
// heads sharing 1 KV head of 8, MLP 64; performer and darkformer with 16 features in chunks of 8.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "model/gemma_model.h"

namespace darkformer::testing {

inline GemmaConfig TinyGemmaConfig(int64_t layers) {
  GemmaConfig c;
  c.family = "gemma";
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.max_position_embeddings = 128;
  return c;
}

inline AttentionConfig TinyAttentionConfig(const std::string& kernel, int64_t layers) {
  const std::string yaml = "{kernel: " + kernel + ", darkformer: {num_features: 16, chunk_size: 8}, " +
                           "performer: {num_features: 16, chunk_size: 8}}";
  return AttentionConfig::FromConfig(ConfigReader(YAML::Load(yaml), "attention"), layers);
}

}  // namespace darkformer::testing
