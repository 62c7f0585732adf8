// Gemma 1 / Gemma 2 / Gemma 3 (text) architecture hyperparameters, read from and written to YAML
// with the same keys as the `config_yaml` attribute of our HDF5 weights (tools/convert_hf_gemma.py).
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "util/config_reader.h"

namespace darkformer {

enum class GemmaFamily { kGemma1, kGemma2, kGemma3 };

struct GemmaConfig {
  std::string family = "gemma";         // gemma | gemma2 | gemma3
  int64_t vocab_size = 256000;
  int64_t hidden_size = 2048;
  int64_t intermediate_size = 16384;    // GeGLU width
  int64_t num_hidden_layers = 18;
  int64_t num_attention_heads = 8;
  int64_t num_key_value_heads = 1;      // < heads: grouped / multi-query attention
  int64_t head_dim = 256;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;          // RoPE base of full-attention layers
  double rope_local_theta = 10000.0;    // RoPE base of sliding-window layers (Gemma 3: 10k)
  double rope_scaling_factor = 1.0;     // linear RoPE scaling of full-attention layers (Gemma 3 4B+: 8)
  int64_t max_position_embeddings = 8192;
  double query_pre_attn_scalar = 0.0;   // attention scale is query_pre_attn_scalar^-1/2; 0 = head_dim
                                        // (Finalize stores head_dim, so 0 and head_dim compare equal)
  double attn_logit_softcapping = 0.0;  // Gemma 2: 50; 0 = off
  double final_logit_softcapping = 0.0; // Gemma 2: 30; 0 = off
  int64_t sliding_window = 0;           // window of sliding layers; 0 = none
  std::vector<std::string> layer_types; // per layer: full_attention | sliding_attention (default by family)
  int64_t pad_token_id = 0;
  int64_t bos_token_id = 2;
  int64_t eos_token_id = 1;

  // Calls fn(name, self.field...) for every field, in file order: the one list of fields that
  // reading, writing and comparing configs share (gemma.cpp's VisitFields). With two configs,
  // fn(name, a.field, b.field).
  template <typename Fn, typename... Self>
  static void VisitFields(Fn&& fn, Self&... self) {
    fn("family", self.family...);
    fn("vocab_size", self.vocab_size...);
    fn("hidden_size", self.hidden_size...);
    fn("intermediate_size", self.intermediate_size...);
    fn("num_hidden_layers", self.num_hidden_layers...);
    fn("num_attention_heads", self.num_attention_heads...);
    fn("num_key_value_heads", self.num_key_value_heads...);
    fn("head_dim", self.head_dim...);
    fn("rms_norm_eps", self.rms_norm_eps...);
    fn("rope_theta", self.rope_theta...);
    fn("rope_local_theta", self.rope_local_theta...);
    fn("rope_scaling_factor", self.rope_scaling_factor...);
    fn("max_position_embeddings", self.max_position_embeddings...);
    fn("query_pre_attn_scalar", self.query_pre_attn_scalar...);
    fn("attn_logit_softcapping", self.attn_logit_softcapping...);
    fn("final_logit_softcapping", self.final_logit_softcapping...);
    fn("sliding_window", self.sliding_window...);
    fn("layer_types", self.layer_types...);
    fn("pad_token_id", self.pad_token_id...);
    fn("bos_token_id", self.bos_token_id...);
    fn("eos_token_id", self.eos_token_id...);
  }

  GemmaFamily Family() const;
  // s in the logits s * q.k.
  double QueryScale() const;
  bool IsSliding(int64_t layer) const;
  double RopeTheta(int64_t layer) const;
  double RopeScaling(int64_t layer) const;
  // Fills defaults that depend on others (layer_types; query_pre_attn_scalar 0 -> head_dim) and
  // checks consistency; errors name the key. Idempotent.
  void Finalize(const std::string& path = "model");

  // Reads the model section; unknown keys are errors naming "<path>.<key>".
  static GemmaConfig FromConfig(const ConfigReader& reader);
  static GemmaConfig FromYamlText(const std::string& yaml_text, const std::string& origin);
  std::string ToYamlText() const;
  // Names every field whose value differs from `other` ("" when equal).
  std::string Diff(const GemmaConfig& other) const;
};

}  // namespace darkformer
