// Typed, path-aware reading of YAML sections (see config_reader.h).
#include "util/config_reader.h"

#include "util/config_file_lines.h"

namespace darkformer {

ConfigReader::ConfigReader(YAML::Node node, std::string path)
    : node_(std::move(node)),
      path_(std::move(path)),
      seen_(std::make_shared<std::set<std::string>>()),
      defaults_(std::make_shared<std::map<std::string, std::string>>()),
      declarations_(std::make_shared<std::vector<KeyDeclaration>>()) {
  if (node_ && !node_.IsNull() && !node_.IsMap()) {
    Fail("config section '" + (path_.empty() ? std::string("<root>") : path_) + "' must be a map, got " +
         YamlTypeName(node_) + ValueOrigin(path_, node_));
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

ConfigReader ConfigReader::Declaring() {
  ConfigReader reader(YAML::Node(YAML::NodeType::Map), "");
  reader.declaring_ = true;
  return reader;
}

ConfigReader ConfigReader::Child(const std::string& key) const {
  seen_->insert(key);
  ConfigReader child(Has(key) ? node_[key] : YAML::Node(YAML::NodeType::Map), KeyPath(key));
  child.defaults_ = defaults_;
  child.declarations_ = declarations_;
  child.declaring_ = declaring_;
  return child;
}

ConfigReader ConfigReader::Child(const std::string& key, const KeySpec& spec) const {
  Declare(key, spec, "", "", /*section=*/true);
  return Child(key);
}

void ConfigReader::Declare(const std::string& key, const KeySpec& spec, std::string shown, std::string rule,
                           bool section, bool required) const {
  const auto path = KeyPath(key);
  KeyDeclaration declaration{path, spec.doc(), std::move(shown), std::move(rule), spec.resumable(), section, required};
  for (auto& declared : *declarations_) {
    // Read twice (a derived kernel re-reads its base's key with its own default): the last read
    // is the one that decides, as for defaults_used; the key keeps its first place.
    if (declared.path == path) {
      declared = std::move(declaration);
      return;
    }
  }
  declarations_->push_back(std::move(declaration));
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
      const std::vector<std::string> declared(seen_->begin(), seen_->end());
      Fail("unknown config key '" + KeyPath(key) + "'" + ValueOrigin(KeyPath(key), node_[key]) +
           DidYouMean(key, declared, path_.empty() ? "" : path_ + ".") + "; known keys here: " + known);
    }
  }
}

namespace {

// The command line's assignments while RunConfig::Load reads: (key path, parsed value, as typed).
struct SetAssignment {
  std::string path;
  YAML::Node value;
  std::string text;
};
thread_local const std::vector<SetAssignment>* set_assignments = nullptr;
thread_local const ScopedFileOrigins* file_origins = nullptr;

}  // namespace

ScopedSetOrigins::ScopedSetOrigins(const std::vector<std::string>& assignments) : previous_(set_assignments) {
  auto* parsed = new std::vector<SetAssignment>();
  for (const auto& text : assignments) {
    const auto eq = text.find('=');
    if (eq == std::string::npos) continue;  // ApplyOverride refuses it
    YAML::Node value;
    try {
      value = YAML::Load(text.substr(eq + 1));
    } catch (const YAML::Exception&) {
      continue;
    }
    parsed->push_back({text.substr(0, eq), value, text});
  }
  set_assignments = parsed;
}

ScopedFileOrigins::ScopedFileOrigins(std::string top_file, std::map<std::string, KeyLine> lines)
    : top_file_(std::move(top_file)), lines_(std::move(lines)), previous_(file_origins) {
  file_origins = this;
}

ScopedFileOrigins::~ScopedFileOrigins() { file_origins = previous_; }

std::string ScopedFileOrigins::Origin(const std::string& key_path) const {
  const auto it = lines_.find(key_path);
  if (it == lines_.end()) return std::string();
  const auto& [file, line] = it->second;
  return " (line " + std::to_string(line) + (file == top_file_ ? "" : " of " + file) + ")";
}

ScopedSetOrigins::~ScopedSetOrigins() {
  delete set_assignments;
  set_assignments = static_cast<const std::vector<SetAssignment>*>(previous_);
}

std::string ValueOrigin(const std::string& key_path, const YAML::Node& value) {
  if (set_assignments) {
    // The last assignment wins, as in ApplyOverride: it gave the key if it names the key itself,
    // or a section above it whose value holds the key.
    for (auto it = set_assignments->rbegin(); it != set_assignments->rend(); ++it) {
      if (it->path == key_path) return " (from --set " + it->text + ")";
      if (key_path.rfind(it->path + ".", 0) != 0) continue;
      YAML::Node node = it->value;
      std::string rest = key_path.substr(it->path.size() + 1);
      bool found = true;
      while (found && !rest.empty()) {
        const auto dot = rest.find('.');
        const std::string key = rest.substr(0, dot);
        rest = dot == std::string::npos ? "" : rest.substr(dot + 1);
        found = node.IsMap() && node[key];
        if (found) node.reset(node[key]);
      }
      if (found) return " (from --set " + it->text + ")";
    }
  }
  // Merged nodes carry no marks: the line each file gave, recorded at load.
  if (file_origins) return file_origins->Origin(key_path);
  return value ? " (line " + std::to_string(value.Mark().line + 1) + ")" : std::string();
}

}  // namespace darkformer
