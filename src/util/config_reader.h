// Typed, path-aware reading of a YAML section: wrong types and unknown keys are errors that
// name the full key path (e.g. "attention.performer.num_features").
#pragma once

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "util/error.h"
#include "util/key_spec.h"
#include "util/nearest_name.h"

namespace darkformer {

// One declared key or section as its read stated it (util/key_spec.h), in reading order.
struct KeyDeclaration {
  std::string path;     // full key path, "train.spikes.window"
  std::string doc;
  std::string shown;    // the default as YAML text (a required key: its example)
  std::string rule;     // accepted values in words ("" = any value of the type)
  bool resumable = false;
  bool section = false;
  bool required = false;
};

class ConfigReader {
 public:
  // `path` is the dotted key path of `node` from the document root ("" for the root).
  explicit ConfigReader(YAML::Node node, std::string path = "");
  // A reader of an empty document that collects every declaration a read makes; a required key
  // reads as its declared example. train/config_reference.h reads the whole run config with it.
  static ConfigReader Declaring();

  bool Has(const std::string& key) const;
  // Value of `key`, or `fallback` when absent. A present value of the wrong type is an error.
  template <typename T>
  T Get(const std::string& key, const T& fallback) const;
  // Value of `key`; absent is an error naming the key path.
  template <typename T>
  T Require(const std::string& key) const;
  // An enum-valued key, parsed once at load: `names` maps each accepted spelling to its value.
  // Absent: `fallback`. Any other string is an error naming the key path and the valid names.
  template <typename E>
  E GetEnum(const std::string& key, E fallback, const std::vector<std::pair<std::string, E>>& names) const;
  // The declared forms: the same reads, which also record the key's declaration and refuse a value
  // that breaks its rule (naming the key path and where the value came from).
  template <typename T>
  T Get(const std::string& key, const T& fallback, const KeySpec& spec) const;
  template <typename T>
  T Require(const std::string& key, const KeySpec& spec) const;
  template <typename E>
  E GetEnum(const std::string& key, E fallback, const std::vector<std::pair<std::string, E>>& names,
            const KeySpec& spec) const;
  // The child section `key` (an empty map node when absent). Marks `key` as known.
  ConfigReader Child(const std::string& key) const;
  ConfigReader Child(const std::string& key, const KeySpec& spec) const;
  // Marks `key` as known without reading it (for sections read elsewhere).
  void Allow(const std::string& key) const;
  // Throws naming the first key of this section that no Get/Require/Child/Allow asked for.
  void RejectUnknown() const;

  std::string KeyPath(const std::string& key) const;
  // The defaults this reader and its children used for absent keys: full key path -> the value
  // as YAML text. With the document, they make the config as the run saw it (train/config_diff.h).
  const std::map<std::string, std::string>& defaults_used() const { return *defaults_; }
  // Every declaration made through this reader and its children, in reading order.
  const std::vector<KeyDeclaration>& declarations() const { return *declarations_; }
  bool declaring() const { return declaring_; }
  const std::string& path() const { return path_; }
  const YAML::Node& node() const { return node_; }
  std::vector<std::string> Keys() const;

 private:
  template <typename T>
  T Convert(const YAML::Node& value, const std::string& key) const;
  template <typename T>
  void RecordDefault(const std::string& key, const T& fallback) const;
  void Declare(const std::string& key, const KeySpec& spec, std::string shown, std::string rule, bool section,
               bool required = false) const;
  template <typename T>
  void CheckRule(const std::string& key, const KeySpec& spec, const T& value) const;

  YAML::Node node_;
  std::string path_;
  std::shared_ptr<std::set<std::string>> seen_;
  std::shared_ptr<std::map<std::string, std::string>> defaults_;  // shared with every child
  std::shared_ptr<std::vector<KeyDeclaration>> declarations_;      // shared with every child
  bool declaring_ = false;
};

// A value as the reference config shows it: numbers in their shortest form, strings quoted only
// where YAML needs it, lists and maps in flow style.
template <typename T>
std::string ShownValue(const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_floating_point_v<T>) {
    return ShortestNumber(value);
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(value);
  } else {
    if constexpr (std::is_same_v<T, std::string>) {
      if (value.empty()) return "\"\"";
    }
    YAML::Emitter text;
    text << YAML::Flow << value;
    return text.c_str();
  }
}

std::string YamlTypeName(const YAML::Node& node);

// Where the value of a key came from, for error messages: " (line N)" of its config file, or
// " (from --set a.b=v)" when a command-line assignment gave it. RunConfig::Load declares the
// assignments for as long as it reads (a ScopedSetOrigins on its stack, this thread only).
std::string ValueOrigin(const std::string& key_path, const YAML::Node& value);

class ScopedSetOrigins {
 public:
  explicit ScopedSetOrigins(const std::vector<std::string>& assignments);
  ~ScopedSetOrigins();
  ScopedSetOrigins(const ScopedSetOrigins&) = delete;
  ScopedSetOrigins& operator=(const ScopedSetOrigins&) = delete;

 private:
  const void* previous_;
};

// `node[key]` as T for files we wrote ourselves (manifests, checkpoint state): absent or of the
// wrong type is an error naming `where`, the key and its line.
template <typename T>
T RequiredField(const YAML::Node& node, const char* key, const std::string& where) {
  DF_CHECK(node.IsMap() && node[key], where << ": missing key '" << key << "'");
  try {
    return node[key].as<T>();
  } catch (const YAML::Exception& e) {
    Fail(where + ": key '" + key + "' (line " + std::to_string(node[key].Mark().line + 1) +
         ") has the wrong type: " + e.what());
  }
}

template <typename T>
T ConfigReader::Convert(const YAML::Node& value, const std::string& key) const {
  try {
    return value.as<T>();
  } catch (const YAML::Exception&) {
    std::string type_name;
    if constexpr (std::is_same_v<T, bool>) type_name = "a boolean";
    else if constexpr (std::is_integral_v<T>) type_name = "an integer";
    else if constexpr (std::is_floating_point_v<T>) type_name = "a number";
    else if constexpr (std::is_same_v<T, std::string>) type_name = "a string";
    else type_name = "a list of values";
    Fail("config key '" + KeyPath(key) + "' must be " + type_name + ", got " + YamlTypeName(value) +
         (value.IsScalar() ? " '" + value.Scalar() + "'" : std::string()) + ValueOrigin(KeyPath(key), value));
  }
}

template <typename T>
void ConfigReader::RecordDefault(const std::string& key, const T& fallback) const {
  if constexpr (std::is_floating_point_v<T>) {
    // The shortest text that reads back as the same number (1e-06, 0.1), not yaml-cpp's 17 digits.
    if (std::isfinite(fallback)) {
      char text[64];
      const auto end = std::to_chars(text, text + sizeof(text), fallback).ptr;
      (*defaults_)[KeyPath(key)] = std::string(text, end);
      return;
    }
  }
  YAML::Emitter text;
  text << YAML::Flow << fallback;
  (*defaults_)[KeyPath(key)] = text.c_str();
}

template <typename T>
T ConfigReader::Get(const std::string& key, const T& fallback) const {
  seen_->insert(key);
  if (!node_.IsMap() || !node_[key] || node_[key].IsNull()) {
    RecordDefault(key, fallback);
    return fallback;
  }
  return Convert<T>(node_[key], key);
}

template <typename T>
T ConfigReader::Require(const std::string& key) const {
  seen_->insert(key);
  DF_CHECK(node_.IsMap() && node_[key] && !node_[key].IsNull(),
           "config key '" << KeyPath(key) << "' is required");
  return Convert<T>(node_[key], key);
}

template <typename E>
E ConfigReader::GetEnum(const std::string& key, E fallback, const std::vector<std::pair<std::string, E>>& names) const {
  if (!Has(key)) {
    seen_->insert(key);
    for (const auto& [name, value] : names) {
      if (value == fallback) {
        RecordDefault(key, name);  // its first spelling
        break;
      }
    }
    return fallback;
  }
  const auto text = Get<std::string>(key, "");
  std::string valid;
  std::vector<std::string> spellings;
  for (const auto& [name, value] : names) {
    if (name == text) return value;
    valid += (valid.empty() ? "" : ", ") + name;
    spellings.push_back(name);
  }
  Fail("config key '" + KeyPath(key) + "' must be one of " + valid + "; got '" + text + "'" +
       ValueOrigin(KeyPath(key), node_[key]) + DidYouMean(text, spellings));
}

template <typename T>
void ConfigReader::CheckRule(const std::string& key, const KeySpec& spec, const T& value) const {
  const auto refusal = spec.Refusal(value);
  if (!refusal.empty()) {
    Fail("config key '" + KeyPath(key) + "' " + refusal + ValueOrigin(KeyPath(key), Has(key) ? node_[key] : YAML::Node()));
  }
}

template <typename T>
T ConfigReader::Get(const std::string& key, const T& fallback, const KeySpec& spec) const {
  Declare(key, spec, ShownValue(fallback), spec.Rule(), /*section=*/false);
  const T value = Get(key, fallback);
  CheckRule(key, spec, value);
  return value;
}

template <typename T>
T ConfigReader::Require(const std::string& key, const KeySpec& spec) const {
  Declare(key, spec, spec.example(), spec.Rule(), /*section=*/false, /*required=*/true);
  if (declaring_ && !Has(key)) {
    seen_->insert(key);
    return YAML::Load(spec.example()).as<T>();
  }
  const T value = Require<T>(key);
  CheckRule(key, spec, value);
  return value;
}

template <typename E>
E ConfigReader::GetEnum(const std::string& key, E fallback, const std::vector<std::pair<std::string, E>>& names,
                        const KeySpec& spec) const {
  std::string rule, shown;
  for (const auto& [name, value] : names) {
    rule += (rule.empty() ? "" : " | ") + name;
    if (value == fallback && shown.empty()) shown = name;
  }
  Declare(key, spec, shown, rule, /*section=*/false);
  return GetEnum(key, fallback, names);
}

// The spelling of `value` in `names` (for logs and resolved configs).
template <typename E>
std::string EnumName(E value, const std::vector<std::pair<std::string, E>>& names) {
  for (const auto& [name, v] : names) {
    if (v == value) return name;
  }
  return "?";
}

}  // namespace darkformer
