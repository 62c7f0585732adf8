// A run's YAML config: sections model, attention, data, train, eval, log. Files may build on a
// `base:` file (resolved relative to the including file); `--set a.b.c=value` overrides any key.
// Unknown keys and wrong types are errors naming the key path.
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <string>
#include <vector>

#include "attention/attention_config.h"
#include "data/data_config.h"
#include "model/gemma_config.h"
#include "train/train_config.h"

namespace darkformer {

struct RunConfig {
  GemmaConfig model;
  AttentionConfig attention;
  DataConfig data;
  TrainConfig train;
  EvalConfig eval;
  LogConfig log;
  YAML::Node resolved;  // the merged document, written into the run directory
  // The defaults used for keys the document leaves out (key path -> YAML text); see config_diff.h.
  std::map<std::string, std::string> defaults;

  // Loads `path` (following `base:` chains), applies overrides, validates every section.
  static RunConfig Load(const std::string& path, const std::vector<std::string>& overrides = {});
  static RunConfig FromNode(YAML::Node root, const std::string& origin);
  // Reads every section through `reader` (the document's root); errors name key paths only.
  static RunConfig Read(const ConfigReader& reader);
};

// Deep-merges `overlay` into `base` (maps merge, anything else replaces).
YAML::Node MergeYaml(const YAML::Node& base, const YAML::Node& overlay);
// Applies "a.b.c=value"; the value is parsed as YAML (numbers, booleans, lists).
void ApplyOverride(YAML::Node& root, const std::string& assignment);

}  // namespace darkformer
