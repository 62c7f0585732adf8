// Sweep files and grid expansion (see sweep_spec.h).
#include "sweep/sweep_spec.h"

#include <filesystem>
#include <set>

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

}  // namespace darkformer
