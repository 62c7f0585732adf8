// Names of a sweep's runs: the run directory and the row of its tables. Short and readable by
// default ("performer-m64_lr1e-4_seed0"), or a grid entry's own `name:`; the long names of
// earlier sweeps are migrated when a sweep next looks at its output.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <utility>
#include <vector>

namespace darkformer {

using GridValues = std::vector<std::pair<std::string, YAML::Node>>;  // (axis key, value), in axis order

// One label per axis joined by "_": a map value gives its `name:` if it has one, else one label
// per leaf joined by "-"; a leaf is its key's short form and its value ("m64", "lr1e-4", "seed0";
// a kernel is its name alone). Characters outside [A-Za-z0-9.+-] become '-'; "run" for no axes.
std::string RunName(const GridValues& values);
// The names of sweeps before short names: "attention--kernel--performer--..._lr-1.0e-4_seed-0".
std::string LegacyRunName(const GridValues& values);
// A YAML node as one line of flow YAML (what `--set key=<this>` parses back to the same node).
std::string FlowYaml(const YAML::Node& node);
// A map value without its `name:` key: what the run's config gets.
YAML::Node WithoutName(const YAML::Node& value);

// Renames `<output>/<legacy>` to `<output>/<name>` for each (legacy, name) whose new directory does
// not exist yet, and the sweep_state.yaml entry with it; refuses (naming both) a directory whose
// trainer is still running.
void MigrateLegacyRunDirs(const std::string& output, const std::vector<std::pair<std::string, std::string>>& renames);

}  // namespace darkformer
