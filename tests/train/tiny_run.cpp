// Helpers for the trainer tests (see tiny_run.h).
#include "train/tiny_run.h"

#include <fstream>
#include <mutex>

#include "data/data_test_util.h"
#include "data/prepare.h"

namespace darkformer::testing {

const TinyShards& LearnableShards() {
  static std::once_flag once;
  static TempDir dir;
  static TinyShards shards;
  std::call_once(once, [] {
    // Words of the tiny tokenizer's corpus, so phrases tokenize into a few pieces each.
    const std::vector<std::string> phrases = {
        "The model learns from text and every token counts.",
        "A small corpus of words makes tests fast.",
        "Attention is a random feature kernel with packing.",
        "The data makes every small model fast.",
    };
    std::vector<std::string> train, val;
    for (int d = 0; d < 240; ++d) {
      std::string doc;
      for (int r = 0; r < 6; ++r) doc += (r ? " " : "") + phrases[d % phrases.size()];
      (d % 10 == 9 ? val : train).push_back(doc);
    }
    WriteGzip(dir.File("c4-train.00000-of-00001.json.gz"), C4Content(train));
    WriteGzip(dir.File("c4-validation.00000-of-00001.json.gz"), C4Content(val));
    PrepareOptions o;
    o.inputs = {dir.File("c4-train.00000-of-00001.json.gz")};
    o.val_inputs = {dir.File("c4-validation.00000-of-00001.json.gz")};
    o.tokenizer = TinyTokenizer();
    o.output_dir = dir.File("shards");
    o.threads = 1;
    RunPrepare(o);
    shards = {o.output_dir, o.tokenizer};
  });
  return shards;
}

YAML::Node TinyRunYaml(const std::string& run_dir, const std::string& kernel,
                       const std::vector<std::string>& overrides) {
  const auto& shards = LearnableShards();
  auto root = YAML::Load(R"(
model:
  family: gemma
  vocab_size: 320
  hidden_size: 32
  intermediate_size: 64
  num_hidden_layers: 2
  num_attention_heads: 2
  num_key_value_heads: 1
  head_dim: 16
attention:
  performer: {num_features: 32}
  darkformer: {num_features: 32}
data:
  seq_len: 32
  batch_size: 8
train:
  steps: 20
  lr: 1.0e-2
  warmup_steps: 5
  schedule: cosine
  weight_decay: 0.0
  device: cpu
  deterministic: true
  checkpoint_every: 0
  seed: 1
eval:
  every: 0
  batches: 2
log:
  every: 0
)");
  root["attention"]["kernel"] = kernel;
  root["data"]["shards_dir"] = shards.shards_dir;
  root["data"]["tokenizer"] = shards.tokenizer;
  root["log"]["dir"] = run_dir;
  for (const auto& assignment : overrides) ApplyOverride(root, assignment);
  return root;
}

RunConfig TinyRunConfig(const std::string& run_dir, const std::string& kernel,
                        const std::vector<std::string>& overrides) {
  return RunConfig::FromNode(TinyRunYaml(run_dir, kernel, overrides), "tiny run config");
}

void WriteYaml(const std::string& path, const YAML::Node& node) {
  YAML::Emitter out;
  out << node;
  std::ofstream(path) << out.c_str() << "\n";
}

std::vector<YAML::Node> ReadJsonl(const std::string& path) {
  std::vector<YAML::Node> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(YAML::Load(line));
  }
  return lines;
}

std::vector<YAML::Node> TrainLines(const std::string& run_dir) {
  std::vector<YAML::Node> train;
  for (const auto& line : ReadJsonl(run_dir + "/metrics.jsonl")) {
    if (line["type"].as<std::string>() == "train") train.push_back(line);
  }
  return train;
}

}  // namespace darkformer::testing
