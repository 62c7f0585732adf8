// Sweep run names (see sweep_names.h).
#include "sweep/sweep_names.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <map>

#include "sweep/sweep_state.h"
#include "util/error.h"

namespace darkformer {

std::string FlowYaml(const YAML::Node& node) {
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

namespace fs = std::filesystem;

namespace {

std::string LastComponent(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

std::string Sanitize(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '+' || c == '-';
    out += ok ? c : '-';
  }
  return out;
}

// How the paper's tables call a key: m for num_features; a kernel needs no key.
std::string ShortKey(const std::string& key) {
  const auto last = LastComponent(key);
  if (last == "num_features") return "m";
  if (last == "kernel") return "";
  return last;
}

bool IsNumber(const std::string& text) {
  double parsed = 0;
  size_t used = 0;
  try {
    parsed = std::stod(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == text.size() && parsed == parsed;
}

// "1.0e-4" -> "1e-4", "3.0" -> "3": the digits a reader needs. Other scalars as written.
std::string ShortValue(const YAML::Node& value) {
  if (!value.IsScalar()) return FlowYaml(value);
  std::string text = value.Scalar();
  if (!IsNumber(text)) return text;
  const auto e = text.find_first_of("eE");
  std::string mantissa = text.substr(0, e), exponent = e == std::string::npos ? "" : text.substr(e + 1);
  if (mantissa.find('.') != std::string::npos && mantissa.find_first_not_of("+-0123456789.") == std::string::npos) {
    while (mantissa.back() == '0') mantissa.pop_back();
    if (mantissa.back() == '.') mantissa.pop_back();
  }
  if (!exponent.empty()) {
    const bool negative = exponent[0] == '-';
    std::string digits = exponent.substr(exponent[0] == '-' || exponent[0] == '+' ? 1 : 0);
    while (digits.size() > 1 && digits[0] == '0') digits.erase(0, 1);
    exponent = "e" + std::string(negative ? "-" : "") + digits;
  }
  return mantissa + exponent;
}

void Leaves(const YAML::Node& node, const std::string& key, std::vector<std::string>& labels) {
  if (node.IsMap()) {
    for (const auto& entry : node) Leaves(entry.second, key + "." + entry.first.as<std::string>(), labels);
    return;
  }
  // A number follows its key ("m64", "lr1e-4"); a word is set apart ("masking-true", "init-whitening").
  const auto short_key = ShortKey(key), value = ShortValue(node);
  const bool number = node.IsScalar() && IsNumber(node.Scalar());
  labels.push_back(Sanitize(short_key.empty() ? value : number ? short_key + value : short_key + "-" + value));
}

}  // namespace

YAML::Node WithoutName(const YAML::Node& value) {
  if (!value.IsMap() || !value["name"]) return value;
  YAML::Node copy = YAML::Clone(value);
  copy.remove("name");
  return copy;
}

std::string RunName(const GridValues& values) {
  std::string name;
  for (const auto& [key, value] : values) {
    std::string label;
    if (value.IsMap() && value["name"]) {
      label = Sanitize(value["name"].as<std::string>());
    } else {
      std::vector<std::string> leaves;
      Leaves(value, key, leaves);
      for (const auto& leaf : leaves) label += (label.empty() ? "" : "-") + leaf;
    }
    name += (name.empty() ? "" : "_") + label;
  }
  return name.empty() ? "run" : name;
}

std::string LegacyRunName(const GridValues& values) {
  std::map<std::string, int> last_count;
  for (const auto& [key, value] : values) ++last_count[LastComponent(key)];
  std::string name;
  for (const auto& [key, value] : values) {
    const auto label = last_count[LastComponent(key)] > 1 ? key : LastComponent(key);
    const auto text = value.IsScalar() ? value.Scalar() : FlowYaml(value);
    if (!name.empty()) name += "_";
    name += Sanitize(label) + "-" + Sanitize(text);
  }
  return name.empty() ? "run" : name;
}

void MigrateLegacyRunDirs(const std::string& output, const std::vector<std::pair<std::string, std::string>>& renames) {
  const auto state_path = (fs::path(output) / "sweep_state.yaml").string();
  auto state = SweepState::Load(state_path);
  bool changed = false;
  for (const auto& [legacy, name] : renames) {
    const fs::path from = fs::path(output) / legacy, to = fs::path(output) / name;
    if (legacy == name || !fs::is_directory(from) || fs::exists(to)) continue;
    // A trainer holds <run>/.lock while it runs: renaming under it would split its run in two.
    const auto lock = (from / ".lock").string();
    const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC);
    const bool busy = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0;
    if (fd >= 0) ::close(fd);
    DF_CHECK(!busy, "sweep run directory " << from.string() << " has the name of an earlier darkformer, and its trainer "
                                           << "is still running: let it finish, then rerun the sweep, which renames it "
                                           << name);
    fs::rename(from, to);
    spdlog::info("sweep: renamed {} to {} (the short run names)", from.string(), name);
    if (const auto it = state.runs.find(legacy); it != state.runs.end()) {
      state.runs[name] = it->second;
      state.runs.erase(it);
      changed = true;
    }
  }
  if (changed) state.Save(state_path);
}

}  // namespace darkformer
