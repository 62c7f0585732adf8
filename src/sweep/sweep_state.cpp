// A sweep's state file (see sweep_state.h).
#include "sweep/sweep_state.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>

#include "util/error.h"

namespace darkformer {

namespace fs = std::filesystem;

SweepState SweepState::Load(const std::string& path) {
  SweepState state;
  if (!fs::exists(path)) return state;
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    Fail(path + ": invalid YAML: " + e.what());
  }
  if (!root["runs"] || !root["runs"].IsMap()) return state;
  for (const auto& entry : root["runs"]) {
    Entry e;
    e.status = entry.second["status"] ? entry.second["status"].as<std::string>() : "";
    e.exit_code = entry.second["exit_code"] ? entry.second["exit_code"].as<int>() : -1;
    e.attempts = entry.second["attempts"] ? entry.second["attempts"].as<int>() : 0;
    state.runs[entry.first.as<std::string>()] = e;
  }
  return state;
}

void SweepState::Save(const std::string& path) const {
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "runs" << YAML::Value << YAML::BeginMap;
  for (const auto& [name, e] : runs) {
    out << YAML::Key << name << YAML::Value << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "status" << YAML::Value << e.status;
    out << YAML::Key << "exit_code" << YAML::Value << e.exit_code;
    out << YAML::Key << "attempts" << YAML::Value << e.attempts << YAML::EndMap;
  }
  out << YAML::EndMap << YAML::EndMap;
  if (!fs::path(path).parent_path().empty()) fs::create_directories(fs::path(path).parent_path());
  const auto tmp = path + ".tmp";
  std::ofstream(tmp) << out.c_str() << "\n";
  fs::rename(tmp, path);
}

}  // namespace darkformer
