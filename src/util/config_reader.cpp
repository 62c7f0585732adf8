// Typed, path-aware reading of YAML sections (see config_reader.h).
#include "util/config_reader.h"

namespace darkformer {

ConfigReader::ConfigReader(YAML::Node node, std::string path)
    : node_(std::move(node)),
      path_(std::move(path)),
      seen_(std::make_shared<std::set<std::string>>()),
      defaults_(std::make_shared<std::map<std::string, std::string>>()) {
  if (node_ && !node_.IsNull() && !node_.IsMap()) {
    Fail("config section '" + (path_.empty() ? std::string("<root>") : path_) + "' must be a map, got " +
         YamlTypeName(node_) + " (line " + std::to_string(node_.Mark().line + 1) + ")");
  }
}

std::string YamlTypeName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Scalar: return "the scalar";
    case YAML::NodeType::Null: return "null";
    default: return "nothing";
  }
}

bool ConfigReader::Has(const std::string& key) const {
  return node_.IsMap() && node_[key] && !node_[key].IsNull();
}

ConfigReader ConfigReader::Child(const std::string& key) const {
  seen_->insert(key);
  ConfigReader child(Has(key) ? node_[key] : YAML::Node(YAML::NodeType::Map), KeyPath(key));
  child.defaults_ = defaults_;
  return child;
}

void ConfigReader::Allow(const std::string& key) const { seen_->insert(key); }

std::string ConfigReader::KeyPath(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

std::vector<std::string> ConfigReader::Keys() const {
  std::vector<std::string> keys;
  if (!node_.IsMap()) return keys;
  for (const auto& entry : node_) keys.push_back(entry.first.as<std::string>());
  return keys;
}

void ConfigReader::RejectUnknown() const {
  for (const auto& key : Keys()) {
    if (!seen_->count(key)) {
      std::string known;
      for (const auto& k : *seen_) known += (known.empty() ? "" : ", ") + k;
      Fail("unknown config key '" + KeyPath(key) + "' (line " +
           std::to_string(node_[key].Mark().line + 1) + "); known keys here: " + known);
    }
  }
}

}  // namespace darkformer
