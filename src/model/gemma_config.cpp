// Gemma configuration: YAML reading/writing, family defaults and validation.
#include "model/gemma_config.h"

#include <cmath>
#include <sstream>

namespace darkformer {

GemmaFamily GemmaConfig::Family() const {
  if (family == "gemma") return GemmaFamily::kGemma1;
  if (family == "gemma2") return GemmaFamily::kGemma2;
  return GemmaFamily::kGemma3;
}

double GemmaConfig::QueryScale() const {
  const double scalar = query_pre_attn_scalar > 0 ? query_pre_attn_scalar : static_cast<double>(head_dim);
  return 1.0 / std::sqrt(scalar);
}

bool GemmaConfig::IsSliding(int64_t layer) const {
  return sliding_window > 0 && layer_types.at(layer) == "sliding_attention";
}

double GemmaConfig::RopeTheta(int64_t layer) const {
  return layer_types.at(layer) == "sliding_attention" ? rope_local_theta : rope_theta;
}

double GemmaConfig::RopeScaling(int64_t layer) const {
  return layer_types.at(layer) == "sliding_attention" ? 1.0 : rope_scaling_factor;
}

void GemmaConfig::Finalize(const std::string& path) {
  auto key = [&](const char* k) { return path + "." + k; };
  DF_CHECK(family == "gemma" || family == "gemma2" || family == "gemma3",
           "config key '" << key("family") << "' must be one of gemma, gemma2, gemma3; got '" << family << "'");
  DF_CHECK(vocab_size > 0, "config key '" << key("vocab_size") << "' must be positive");
  DF_CHECK(hidden_size > 0, "config key '" << key("hidden_size") << "' must be positive");
  DF_CHECK(intermediate_size > 0, "config key '" << key("intermediate_size") << "' must be positive");
  DF_CHECK(num_hidden_layers > 0, "config key '" << key("num_hidden_layers") << "' must be positive");
  DF_CHECK(head_dim > 0 && head_dim % 2 == 0, "config key '" << key("head_dim") << "' must be positive and even (RoPE)");
  DF_CHECK(num_attention_heads > 0, "config key '" << key("num_attention_heads") << "' must be positive");
  DF_CHECK(num_key_value_heads > 0 && num_attention_heads % num_key_value_heads == 0,
           "config key '" << key("num_key_value_heads") << "' (" << num_key_value_heads
                          << ") must divide num_attention_heads (" << num_attention_heads << ")");
  DF_CHECK(rms_norm_eps > 0, "config key '" << key("rms_norm_eps") << "' must be positive");
  DF_CHECK(sliding_window >= 0, "config key '" << key("sliding_window") << "' must be >= 0");
  if (layer_types.empty()) {
    // HF defaults: Gemma 2 alternates sliding/full starting with sliding; Gemma 3 has 5 sliding : 1 full.
    for (int64_t i = 0; i < num_hidden_layers; ++i) {
      bool sliding = false;
      if (family == "gemma2") sliding = (i + 1) % 2 != 0;
      if (family == "gemma3") sliding = (i + 1) % 6 != 0;
      layer_types.push_back(sliding ? "sliding_attention" : "full_attention");
    }
  }
  DF_CHECK(static_cast<int64_t>(layer_types.size()) == num_hidden_layers,
           "config key '" << key("layer_types") << "' has " << layer_types.size() << " entries, but "
                          << key("num_hidden_layers") << " is " << num_hidden_layers);
  for (size_t i = 0; i < layer_types.size(); ++i) {
    DF_CHECK(layer_types[i] == "full_attention" || layer_types[i] == "sliding_attention",
             "config key '" << key("layer_types") << "[" << i << "]' must be full_attention or "
                            << "sliding_attention, got '" << layer_types[i] << "'");
  }
}

GemmaConfig GemmaConfig::FromConfig(const ConfigReader& r) {
  GemmaConfig c;
  c.family = r.Get<std::string>("family", c.family);
  c.vocab_size = r.Get<int64_t>("vocab_size", c.vocab_size);
  c.hidden_size = r.Get<int64_t>("hidden_size", c.hidden_size);
  c.intermediate_size = r.Get<int64_t>("intermediate_size", c.intermediate_size);
  c.num_hidden_layers = r.Get<int64_t>("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = r.Get<int64_t>("num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = r.Get<int64_t>("num_key_value_heads", c.num_key_value_heads);
  c.head_dim = r.Get<int64_t>("head_dim", c.head_dim);
  c.rms_norm_eps = r.Get<double>("rms_norm_eps", c.rms_norm_eps);
  c.rope_theta = r.Get<double>("rope_theta", c.rope_theta);
  c.rope_local_theta = r.Get<double>("rope_local_theta", c.rope_theta);
  c.rope_scaling_factor = r.Get<double>("rope_scaling_factor", c.rope_scaling_factor);
  c.max_position_embeddings = r.Get<int64_t>("max_position_embeddings", c.max_position_embeddings);
  c.query_pre_attn_scalar = r.Get<double>("query_pre_attn_scalar", c.query_pre_attn_scalar);
  c.attn_logit_softcapping = r.Get<double>("attn_logit_softcapping", c.attn_logit_softcapping);
  c.final_logit_softcapping = r.Get<double>("final_logit_softcapping", c.final_logit_softcapping);
  c.sliding_window = r.Get<int64_t>("sliding_window", c.sliding_window);
  c.layer_types = r.Get<std::vector<std::string>>("layer_types", {});
  c.pad_token_id = r.Get<int64_t>("pad_token_id", c.pad_token_id);
  c.bos_token_id = r.Get<int64_t>("bos_token_id", c.bos_token_id);
  c.eos_token_id = r.Get<int64_t>("eos_token_id", c.eos_token_id);
  r.RejectUnknown();
  c.Finalize(r.path().empty() ? "model" : r.path());
  return c;
}

GemmaConfig GemmaConfig::FromYamlText(const std::string& yaml_text, const std::string& origin) {
  YAML::Node node;
  try {
    node = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    Fail(origin + ": model config is not valid YAML: " + e.what());
  }
  try {
    return FromConfig(ConfigReader(node, "model"));
  } catch (const Error& e) {
    Fail(origin + ": " + e.what());
  }
}

std::string GemmaConfig::ToYamlText() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "family" << YAML::Value << family;
  out << YAML::Key << "vocab_size" << YAML::Value << vocab_size;
  out << YAML::Key << "hidden_size" << YAML::Value << hidden_size;
  out << YAML::Key << "intermediate_size" << YAML::Value << intermediate_size;
  out << YAML::Key << "num_hidden_layers" << YAML::Value << num_hidden_layers;
  out << YAML::Key << "num_attention_heads" << YAML::Value << num_attention_heads;
  out << YAML::Key << "num_key_value_heads" << YAML::Value << num_key_value_heads;
  out << YAML::Key << "head_dim" << YAML::Value << head_dim;
  out << YAML::Key << "rms_norm_eps" << YAML::Value << rms_norm_eps;
  out << YAML::Key << "rope_theta" << YAML::Value << rope_theta;
  out << YAML::Key << "rope_local_theta" << YAML::Value << rope_local_theta;
  out << YAML::Key << "rope_scaling_factor" << YAML::Value << rope_scaling_factor;
  out << YAML::Key << "max_position_embeddings" << YAML::Value << max_position_embeddings;
  out << YAML::Key << "query_pre_attn_scalar" << YAML::Value << query_pre_attn_scalar;
  out << YAML::Key << "attn_logit_softcapping" << YAML::Value << attn_logit_softcapping;
  out << YAML::Key << "final_logit_softcapping" << YAML::Value << final_logit_softcapping;
  out << YAML::Key << "sliding_window" << YAML::Value << sliding_window;
  out << YAML::Key << "layer_types" << YAML::Value << YAML::Flow << layer_types;
  out << YAML::Key << "pad_token_id" << YAML::Value << pad_token_id;
  out << YAML::Key << "bos_token_id" << YAML::Value << bos_token_id;
  out << YAML::Key << "eos_token_id" << YAML::Value << eos_token_id;
  out << YAML::EndMap;
  return out.c_str();
}

std::string GemmaConfig::Diff(const GemmaConfig& o) const {
  std::ostringstream d;
  auto field = [&](const char* name, auto a, auto b) {
    if (!(a == b)) d << (d.tellp() > 0 ? "; " : "") << name << ": " << a << " vs " << b;
  };
  field("family", family, o.family);
  field("vocab_size", vocab_size, o.vocab_size);
  field("hidden_size", hidden_size, o.hidden_size);
  field("intermediate_size", intermediate_size, o.intermediate_size);
  field("num_hidden_layers", num_hidden_layers, o.num_hidden_layers);
  field("num_attention_heads", num_attention_heads, o.num_attention_heads);
  field("num_key_value_heads", num_key_value_heads, o.num_key_value_heads);
  field("head_dim", head_dim, o.head_dim);
  field("rms_norm_eps", rms_norm_eps, o.rms_norm_eps);
  field("rope_theta", rope_theta, o.rope_theta);
  field("rope_local_theta", rope_local_theta, o.rope_local_theta);
  field("rope_scaling_factor", rope_scaling_factor, o.rope_scaling_factor);
  field("query_pre_attn_scalar", query_pre_attn_scalar, o.query_pre_attn_scalar);
  field("attn_logit_softcapping", attn_logit_softcapping, o.attn_logit_softcapping);
  field("final_logit_softcapping", final_logit_softcapping, o.final_logit_softcapping);
  field("sliding_window", sliding_window, o.sliding_window);
  if (layer_types != o.layer_types) d << (d.tellp() > 0 ? "; " : "") << "layer_types differ";
  return d.str();
}

}  // namespace darkformer
