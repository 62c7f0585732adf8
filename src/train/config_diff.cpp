// Key-by-key comparison of run configs (see config_diff.h).
#include "train/config_diff.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>
#include <set>

#include "train/checkpoint.h"
#include "train/config_reference.h"
#include "util/error.h"

namespace darkformer {

namespace fs = std::filesystem;

namespace {

void Flatten(const YAML::Node& node, const std::string& path, FlatConfig& out) {
  if (node.IsMap()) {
    for (const auto& entry : node) {
      const auto key = entry.first.as<std::string>();
      Flatten(entry.second, path.empty() ? key : path + "." + key, out);
    }
  } else if (node.IsSequence()) {
    YAML::Emitter text;
    text << YAML::Flow << node;
    out.emplace_back(path, text.c_str());
  } else if (node.IsScalar()) {
    out.emplace_back(path, node.Scalar());
  }  // null: as absent, so the default the reader used stands in (ConfigReader treats it so)
}

template <typename T>
std::optional<T> As(const std::string& text) {
  try {
    return YAML::Load(text).as<T>();
  } catch (const YAML::Exception&) {
    return std::nullopt;
  }
}

bool SameValue(const std::string& a, const std::string& b) {
  if (a == b) return true;
  if (const auto x = As<double>(a), y = As<double>(b); x && y) return *x == *y;
  if (const auto x = As<bool>(a), y = As<bool>(b); x && y) return *x == *y;
  return false;
}

bool Ignored(const std::string& key, const std::vector<std::string>& prefixes) {
  for (const auto& prefix : prefixes) {
    if (key == prefix || key.rfind(prefix + ".", 0) == 0) return true;
  }
  return false;
}

std::string Escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else out += c;
  }
  return out;
}

std::string Unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 == text.size()) {
      out += text[i];
      continue;
    }
    const char next = text[++i];
    out += next == 'n' ? '\n' : next == 't' ? '\t' : next;
  }
  return out;
}

}  // namespace

FlatConfig FlattenConfig(const YAML::Node& document, const std::map<std::string, std::string>& defaults) {
  FlatConfig flat;
  Flatten(document, "", flat);
  std::set<std::string> present;
  for (const auto& [key, value] : flat) present.insert(key);
  for (const auto& [key, value] : defaults) {
    if (!present.count(key)) flat.emplace_back(key, value);
  }
  return flat;
}

std::string SerializeFlatConfig(const FlatConfig& config) {
  std::string text;
  for (const auto& [key, value] : config) text += Escape(key) + "\t" + Escape(value) + "\n";
  return text;
}

FlatConfig ParseFlatConfig(const std::string& text) {
  FlatConfig config;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string line = text.substr(start, end - start);
    const size_t tab = line.find('\t');
    DF_CHECK(tab != std::string::npos, "flattened config: line without a tab: '" << line << "'");
    config.emplace_back(Unescape(line.substr(0, tab)), Unescape(line.substr(tab + 1)));
    start = end + 1;
  }
  return config;
}

std::optional<ConfigDifference> FirstDifference(const FlatConfig& first, const FlatConfig& second,
                                                const std::vector<std::string>& ignored) {
  const std::map<std::string, std::string> a(first.begin(), first.end()), b(second.begin(), second.end());
  constexpr const char* kAbsent = "(not set)";
  for (const auto& [key, value] : first) {
    if (Ignored(key, ignored)) continue;
    const auto other = b.find(key);
    if (other == b.end()) return ConfigDifference{key, value, kAbsent};
    if (!SameValue(value, other->second)) return ConfigDifference{key, value, other->second};
  }
  for (const auto& [key, value] : second) {
    if (!Ignored(key, ignored) && !a.count(key)) return ConfigDifference{key, kAbsent, value};
  }
  return std::nullopt;
}

const std::vector<std::string>& KeysThatMayChangeOnResume() {
  static const std::vector<std::string> keys = ResumableKeys(DeclaredRunConfigKeys());
  return keys;
}

void CheckResumedConfig(const RunConfig& config) {
  const std::string& dir = config.log.dir;
  const std::string recorded = (fs::path(dir) / "config.yaml").string();
  if (!fs::is_regular_file(recorded) || ListCheckpoints(dir).empty()) return;  // nothing to resume
  YAML::Node document;
  try {
    document = YAML::LoadFile(recorded);
  } catch (const YAML::Exception& e) {
    spdlog::warn("{}: unreadable ({}); the resume cannot compare configs and rewrites it", recorded, e.what());
    return;
  }
  // The recorded document with the defaults it leaves out, as this binary reads them (quietly: its
  // notes were logged when the run started). A document this binary no longer accepts borrows
  // the command's defaults.
  auto recorded_defaults = config.defaults;
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::warn);
  try {
    recorded_defaults = RunConfig::FromNode(YAML::Clone(document), recorded).defaults;
  } catch (const Error&) {
  }
  spdlog::set_level(level);
  const auto difference = FirstDifference(FlattenConfig(document, recorded_defaults), FlattenConfig(config),
                                          KeysThatMayChangeOnResume());
  if (!difference) return;
  Fail("config key '" + difference->key + "' differs from the run's: " + recorded + " has " + difference->first +
       ", this command " + difference->second + ". The checkpoints in " + dir +
       " were made with the recorded config: restore the key, or use another log.dir (docs/training.md lists the "
       "keys a resume may change)");
}

}  // namespace darkformer
