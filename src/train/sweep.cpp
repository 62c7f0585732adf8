// Sweep files, grid expansion, run naming, run status and summary tables (see sweep.h).
#include "train/sweep.h"

#include <algorithm>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>

#include "train/run_config.h"
#include "util/config_reader.h"
#include "util/error.h"

namespace darkformer {

namespace fs = std::filesystem;

namespace {

// Flattens nested maps into dotted leaf paths: {train: {lr: [..]}} and {train.lr: [..]} both give
// ("train.lr", [..]). Sequences and scalars are leaves.
void Flatten(const YAML::Node& node, const std::string& prefix, std::vector<std::pair<std::string, YAML::Node>>& out) {
  if (node.IsMap()) {
    for (const auto& entry : node) {
      const auto key = entry.first.as<std::string>();
      Flatten(entry.second, prefix.empty() ? key : prefix + "." + key, out);
    }
    return;
  }
  out.emplace_back(prefix, node);
}

std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

// The row's cells after the grid values, shared by CSV and Markdown.
std::vector<std::string> ResultCells(const SweepRecord& r) {
  std::vector<std::string> cells = {RunStatusName(r.status), std::to_string(r.exit_code)};
  const auto summary = r.summary ? r.summary->Cells() : std::vector<std::string>(RunSummary::ColumnNames().size());
  cells.insert(cells.end(), summary.begin(), summary.end());
  return cells;
}

std::vector<std::string> ResultColumns() {
  std::vector<std::string> columns = {"status", "exit_code"};
  for (const auto& name : RunSummary::ColumnNames()) columns.push_back(name);
  return columns;
}

}  // namespace

SweepSpec SweepSpec::Load(const std::string& path, const std::vector<std::string>& overrides) {
  DF_CHECK(fs::exists(path), "sweep file not found: " << path);
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    Fail(path + ": invalid YAML: " + e.what());
  }
  for (const auto& assignment : overrides) ApplyOverride(root, assignment);
  auto spec = FromNode(root, path, fs::path(path).parent_path().string());
  spec.path = path;
  return spec;
}

SweepSpec SweepSpec::FromNode(const YAML::Node& root, const std::string& origin, const std::string& folder) {
  try {
    const ConfigReader reader(root, "");
    SweepSpec spec;
    const auto base = reader.Require<std::string>("base");
    spec.base = fs::path(base).is_absolute() || folder.empty() ? base : (fs::path(folder) / base).lexically_normal().string();
    spec.output = reader.Require<std::string>("output");
    spec.parallel = reader.Get<int64_t>("parallel", spec.parallel);
    DF_CHECK(spec.parallel >= 1, "config key 'parallel' must be >= 1, got " << spec.parallel);
    if (reader.Has("devices")) {
      const auto node = reader.node()["devices"];
      reader.Allow("devices");
      if (node.IsScalar() && node.as<std::string>() == "auto") {
        spec.devices_auto = true;
      } else {
        DF_CHECK(node.IsSequence() && node.size() > 0, "config key 'devices' must be a list of CUDA device indices or auto");
        for (const auto& d : node) {
          int64_t index = -1;
          try {
            index = d.as<int64_t>();
          } catch (const YAML::Exception&) {
          }
          DF_CHECK(index >= 0, "config key 'devices' has '" << FlowYaml(d) << "': not a CUDA device index");
          DF_CHECK(std::find(spec.devices.begin(), spec.devices.end(), index) == spec.devices.end(),
                   "config key 'devices' lists device " << index << " twice");
          spec.devices.push_back(index);
        }
      }
    }

    reader.Allow("grid");
    DF_CHECK(reader.Has("grid") && reader.node()["grid"].IsMap(), "config key 'grid' must be a map of key path -> list");
    std::vector<std::pair<std::string, YAML::Node>> axes;
    Flatten(reader.node()["grid"], "", axes);
    for (const auto& [key, values] : axes) {
      DF_CHECK(!key.empty(), "config key 'grid' has an empty key");
      SweepAxis axis{key, {}};
      if (values.IsSequence()) {
        for (const auto& v : values) axis.values.push_back(YAML::Clone(v));
      } else {
        axis.values.push_back(YAML::Clone(values));  // a single value: a fixed key, shown in the tables
      }
      DF_CHECK(!axis.values.empty(), "config key 'grid." << key << "' has no values");
      spec.grid.push_back(std::move(axis));
    }

    reader.Allow("fixed");
    if (reader.Has("fixed")) {
      DF_CHECK(reader.node()["fixed"].IsMap(), "config key 'fixed' must be a map of key path -> value");
      std::vector<std::pair<std::string, YAML::Node>> fixed;
      Flatten(reader.node()["fixed"], "", fixed);
      for (const auto& [key, value] : fixed) spec.fixed.push_back(key + "=" + FlowYaml(value));
    }
    if (reader.Has("launcher")) {
      const auto launcher = reader.Child("launcher");
      spec.launcher.torchrun = launcher.Get<std::string>("torchrun", spec.launcher.torchrun);
      spec.launcher.nproc_per_node = launcher.Require<int64_t>("nproc_per_node");
      spec.launcher.args = launcher.Get<std::vector<std::string>>("args", spec.launcher.args);
      launcher.RejectUnknown();
      DF_CHECK(spec.launcher.nproc_per_node >= 1, "config key '" << launcher.KeyPath("nproc_per_node")
                                                                 << "' must be >= 1, got " << spec.launcher.nproc_per_node);
      DF_CHECK(!spec.launcher.torchrun.empty(), "config key '" << launcher.KeyPath("torchrun") << "' must not be empty");
    }
    reader.Get<std::string>("description", "");  // free text for people reading the file
    reader.RejectUnknown();
    return spec;
  } catch (const Error& e) {
    Fail(origin + ": " + e.what());
  }
}

std::string FlowYaml(const YAML::Node& node) {
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

std::vector<SweepPoint> ExpandGrid(const std::vector<SweepAxis>& grid) {
  std::vector<SweepPoint> points(1);
  for (const auto& axis : grid) {
    std::vector<SweepPoint> next;
    for (const auto& point : points) {
      for (const auto& value : axis.values) {
        auto extended = point;
        extended.values.emplace_back(axis.key, value);
        next.push_back(std::move(extended));
      }
    }
    points = std::move(next);
  }
  // Short names; where two points would share one, every point keeps the long form instead.
  std::set<std::string> short_names;
  bool unique = true;
  for (const auto& point : points) unique = short_names.insert(RunName(point.values)).second && unique;
  std::set<std::string> names;
  for (auto& point : points) {
    point.legacy_name = LegacyRunName(point.values);
    point.name = unique ? RunName(point.values) : point.legacy_name;
    for (auto& [key, value] : point.values) value = WithoutName(value);  // `name:` names, it sets nothing
    DF_CHECK(names.insert(point.name).second,
             "two grid points share the run name '" << point.name << "' (repeated values in the grid?)");
  }
  return points;
}

std::string RunDir(const SweepSpec& spec, const SweepPoint& point) {
  return (fs::path(spec.output) / point.name).string();
}

std::vector<std::string> RunOverrides(const SweepSpec& spec, const SweepPoint& point) {
  auto overrides = spec.fixed;
  for (const auto& [key, value] : point.values) overrides.push_back(key + "=" + FlowYaml(value));
  overrides.push_back("log.dir=" + FlowYaml(YAML::Node(RunDir(spec, point))));
  return overrides;
}

const char* RunStatusName(RunStatus status) {
  switch (status) {
    case RunStatus::kPending: return "pending";
    case RunStatus::kPartial: return "partial";
    case RunStatus::kFailed: return "failed";
    case RunStatus::kDiverged: return "diverged";
    case RunStatus::kFinished: return "finished";
  }
  return "unknown";
}

RunStatus ClassifyRun(const std::string& run_dir, const std::optional<RunSummary>& summary, int64_t target_steps,
                      int last_exit_code) {
  if (summary && summary->diverged) return RunStatus::kDiverged;
  if (summary && summary->steps >= target_steps) return RunStatus::kFinished;
  if (last_exit_code > 0 && last_exit_code != 130) return RunStatus::kFailed;
  if (summary || fs::exists(fs::path(run_dir) / "checkpoints") || fs::exists(fs::path(run_dir) / "metrics.jsonl")) {
    return RunStatus::kPartial;
  }
  return RunStatus::kPending;
}

RunStatus StatusOfRunDir(const std::string& run_dir) {
  const fs::path dir = fs::path(run_dir).lexically_normal();
  const fs::path run = dir.has_filename() ? dir : dir.parent_path();  // "a/b/" names b
  int64_t target_steps = TrainConfig().steps;
  try {
    const auto config = YAML::LoadFile((run / "config.yaml").string());
    if (config["train"] && config["train"]["steps"]) target_steps = config["train"]["steps"].as<int64_t>();
  } catch (const YAML::Exception&) {
    // No readable config.yaml: a run that never started (pending) or not ours; the default stands.
  }
  const auto state = SweepState::Load((run.parent_path() / "sweep_state.yaml").string());
  const auto it = state.runs.find(run.filename().string());
  return ClassifyRun(run.string(), ReadRunSummary(run.string()), target_steps,
                     it == state.runs.end() ? -1 : it->second.exit_code);
}

bool NeedsRun(RunStatus status) { return status != RunStatus::kFinished && status != RunStatus::kDiverged; }

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

void WriteSummaryCsv(const std::vector<SweepRecord>& records, const std::vector<std::string>& grid_keys,
                     const std::string& path) {
  std::ofstream out(path);
  DF_CHECK(out, "cannot write " << path);
  out << "run";
  for (const auto& key : grid_keys) out << "," << CsvField(key);
  for (const auto& column : ResultColumns()) out << "," << column;
  out << "\n";
  for (const auto& r : records) {
    out << CsvField(r.point.name);
    for (const auto& [key, value] : r.point.values) out << "," << CsvField(value.IsScalar() ? value.Scalar() : FlowYaml(value));
    for (const auto& cell : ResultCells(r)) out << "," << CsvField(cell);
    out << "\n";
  }
}

void WriteSummaryMarkdown(const std::vector<SweepRecord>& records, const std::vector<std::string>& grid_keys,
                          const std::string& path, const std::string& title) {
  std::ofstream out(path);
  DF_CHECK(out, "cannot write " << path);
  auto escape = [](std::string text) {
    std::string out;
    for (const char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
  };
  out << "# " << title << "\n\n|";
  for (const auto& key : grid_keys) out << " `" << key << "` |";
  for (const auto& column : ResultColumns()) out << " " << column << " |";
  out << "\n|";
  for (size_t i = 0; i < grid_keys.size() + ResultColumns().size(); ++i) out << (i < grid_keys.size() ? "---|" : "--:|");
  out << "\n";
  for (const auto& r : records) {
    out << "|";
    for (const auto& [key, value] : r.point.values) out << " " << escape(value.IsScalar() ? value.Scalar() : FlowYaml(value)) << " |";
    for (const auto& cell : ResultCells(r)) out << " " << cell << " |";
    out << "\n";
  }
  out << "\nStatus: finished | diverged (stopped on a non-finite loss) | failed | partial | pending. "
         "Run names and directories are in summary.csv.\n";
}

}  // namespace darkformer
