// Gemma 1 / Gemma 2 / Gemma 3 (text) architecture hyperparameters, read from and written to YAML
// with the same keys as the `config_yaml` attribute of our HDF5 weights (tools/convert_hf_gemma.py).
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "util/config_reader.h"

namespace darkformer {

enum class GemmaFamily { kGemma1, kGemma2, kGemma3 };

// A field's key and its declaration (doc line and rule: util/key_spec.h); converts to the key, so
// a visitor may take `const char* name`.
struct ModelField {
  const char* name;
  KeySpec spec;
  operator const char*() const { return name; }  // NOLINT: implicit by design
};

struct GemmaConfig {
  // Doc lines and rules: in VisitFields.
  std::string family = "gemma";
  int64_t vocab_size = 256000;
  int64_t hidden_size = 2048;
  int64_t intermediate_size = 16384;
  int64_t num_hidden_layers = 18;
  int64_t num_attention_heads = 8;
  int64_t num_key_value_heads = 1;
  int64_t head_dim = 256;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double rope_local_theta = 10000.0;  // absent: rope_theta
  double rope_scaling_factor = 1.0;
  int64_t max_position_embeddings = 8192;
  double query_pre_attn_scalar = 0.0;  // Finalize stores head_dim for 0, so 0 and head_dim compare equal
  double attn_logit_softcapping = 0.0;
  double final_logit_softcapping = 0.0;
  int64_t sliding_window = 0;
  std::vector<std::string> layer_types;  // empty: the family's default (Finalize)
  int64_t pad_token_id = 0;
  int64_t bos_token_id = 2;
  int64_t eos_token_id = 1;

  // Calls fn(field, self.field...) for every field, in file order: the one list of fields that
  // reading, writing, checking and comparing configs share (gemma.cpp's VisitFields), with each
  // key's declaration. With two configs, fn(field, a.field, b.field).
  template <typename Fn, typename... Self>
  static void VisitFields(Fn&& fn, Self&... self) {
    const auto positive = [](const char* doc) { return KeySpec(doc).Above(0); };
    fn(ModelField{"family", KeySpec("the architecture").OneOf({"gemma", "gemma2", "gemma3"})}, self.family...);
    fn(ModelField{"vocab_size", positive("tokens in the vocabulary")}, self.vocab_size...);
    fn(ModelField{"hidden_size", positive("the residual stream's width")}, self.hidden_size...);
    fn(ModelField{"intermediate_size", positive("GeGLU width")}, self.intermediate_size...);
    fn(ModelField{"num_hidden_layers", positive("decoder layers")}, self.num_hidden_layers...);
    fn(ModelField{"num_attention_heads", positive("query heads")}, self.num_attention_heads...);
    fn(ModelField{"num_key_value_heads", positive("key/value heads, dividing the query heads; fewer: grouped / multi-query attention")}, self.num_key_value_heads...);
    fn(ModelField{"head_dim", positive("d, each head's width").MultipleOf(2, "RoPE")}, self.head_dim...);
    fn(ModelField{"rms_norm_eps", positive("RMSNorm's epsilon")}, self.rms_norm_eps...);
    fn(ModelField{"rope_theta", KeySpec("RoPE base of full-attention layers")}, self.rope_theta...);
    fn(ModelField{"rope_local_theta", KeySpec("RoPE base of sliding-window layers (absent: rope_theta; Gemma 3: 10k)")}, self.rope_local_theta...);
    fn(ModelField{"rope_scaling_factor", KeySpec("linear RoPE scaling of full-attention layers (Gemma 3 4B+: 8)")}, self.rope_scaling_factor...);
    fn(ModelField{"max_position_embeddings", KeySpec("the longest sequence the model supports")}, self.max_position_embeddings...);
    fn(ModelField{"query_pre_attn_scalar", KeySpec("attention scale s = query_pre_attn_scalar^-1/2").Min(0, "0 = head_dim")}, self.query_pre_attn_scalar...);
    fn(ModelField{"attn_logit_softcapping", KeySpec("Gemma 2: 50; 0 = off (random-feature kernels cannot apply it)")}, self.attn_logit_softcapping...);
    fn(ModelField{"final_logit_softcapping", KeySpec("Gemma 2: 30; 0 = off")}, self.final_logit_softcapping...);
    fn(ModelField{"sliding_window", KeySpec("window of sliding layers").Min(0, "0 = none")}, self.sliding_window...);
    fn(ModelField{"layer_types", KeySpec("per layer, num_hidden_layers of them; [] = the family's default").OneOf({"full_attention", "sliding_attention"})}, self.layer_types...);
    fn(ModelField{"pad_token_id", KeySpec("padding id")}, self.pad_token_id...);
    fn(ModelField{"bos_token_id", KeySpec("beginning-of-sequence id")}, self.bos_token_id...);
    fn(ModelField{"eos_token_id", KeySpec("end-of-sequence id (document boundaries)")}, self.eos_token_id...);
  }

  GemmaFamily Family() const;
  // s in the logits s * q.k.
  double QueryScale() const;
  bool IsSliding(int64_t layer) const;
  double RopeTheta(int64_t layer) const;
  double RopeScaling(int64_t layer) const;
  // Checks every field against its declaration (a config built in code too), fills defaults that
  // depend on others (layer_types; query_pre_attn_scalar 0 -> head_dim) and checks the rules
  // between keys; errors name the key. Idempotent.
  void Finalize(const std::string& path = "model");

  // Reads the model section; unknown keys are errors naming "<path>.<key>".
  static GemmaConfig FromConfig(const ConfigReader& reader);
  static GemmaConfig FromYamlText(const std::string& yaml_text, const std::string& origin);
  std::string ToYamlText() const;
  // Names every field whose value differs from `other` ("" when equal).
  std::string Diff(const GemmaConfig& other) const;
};

}  // namespace darkformer
