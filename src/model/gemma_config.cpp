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
  // Before Finalize the scalar may still be 0 ("use head_dim").
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
  VisitFields(
      [&](const ModelField& field, const auto& value) {
        const auto refusal = field.spec.Refusal(value);
        DF_CHECK(refusal.empty(), "config key '" << key(field.name) << "' " << refusal);
      },
      *this);
  // Rules between keys.
  DF_CHECK(num_attention_heads % num_key_value_heads == 0,
           "config key '" << key("num_key_value_heads") << "' (" << num_key_value_heads
                          << ") must divide num_attention_heads (" << num_attention_heads << ")");
  // HF's Gemma 1 config has no such key and Gemma 2/3 configs may omit it: both mean head_dim.
  // Normalised here, once, so a file that says head_dim and a config that says nothing agree.
  if (query_pre_attn_scalar == 0) query_pre_attn_scalar = static_cast<double>(head_dim);
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
}

GemmaConfig GemmaConfig::FromConfig(const ConfigReader& r) {
  GemmaConfig c;
  c.layer_types.clear();  // empty = the family's default pattern (Finalize)
  VisitFields([&](const ModelField& key, auto& field) { field = r.Get(key.name, field, key.spec); }, c);
  if (!r.Has("rope_local_theta")) c.rope_local_theta = c.rope_theta;
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
  VisitFields(
      [&](const char* name, const auto& field) {
        out << YAML::Key << name << YAML::Value;
        if constexpr (std::is_same_v<std::decay_t<decltype(field)>, std::vector<std::string>>) out << YAML::Flow;
        out << field;
      },
      *this);
  out << YAML::EndMap;
  return out.c_str();
}

std::string GemmaConfig::Diff(const GemmaConfig& other) const {
  std::ostringstream d;
  VisitFields(
      [&](const char* name, const auto& a, const auto& b) {
        if (a == b) return;
        d << (d.tellp() > 0 ? "; " : "") << name << ": ";
        if constexpr (std::is_same_v<std::decay_t<decltype(a)>, std::vector<std::string>>) {
          auto join = [](const std::vector<std::string>& v) {
            std::string s;
            for (const auto& x : v) s += (s.empty() ? "[" : ", ") + x;
            return s + "]";
          };
          d << join(a) << " vs " << join(b);
        } else {
          d << a << " vs " << b;
        }
      },
      *this, other);
  return d.str();
}

}  // namespace darkformer
