// Helpers for the trainer tests: token shards of a learnable generated corpus (a few fixed
// phrases, each document one phrase repeated), made once per test binary, and run configs for a
// tiny Gemma over them (vocab of the tiny SentencePiece model, hidden 32, 2 layers, seq_len 32).
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "train/run_config.h"

namespace darkformer::testing {

struct TinyShards {
  std::string shards_dir;
  std::string tokenizer;
};
const TinyShards& LearnableShards();

// A run config (as YAML) for `kernel` writing to `run_dir`; `overrides` are --set style
// assignments applied on top ("train.steps=20").
YAML::Node TinyRunYaml(const std::string& run_dir, const std::string& kernel,
                       const std::vector<std::string>& overrides = {});
RunConfig TinyRunConfig(const std::string& run_dir, const std::string& kernel,
                        const std::vector<std::string>& overrides = {});
// Writes the config to `path` (for runs of the darkformer binary).
void WriteYaml(const std::string& path, const YAML::Node& node);

// Each line of a JSONL file parsed (JSON is YAML's flow syntax; null stays a null node).
std::vector<YAML::Node> ReadJsonl(const std::string& path);
// The "type": "train" lines of a run's metrics.jsonl.
std::vector<YAML::Node> TrainLines(const std::string& run_dir);

}  // namespace darkformer::testing
