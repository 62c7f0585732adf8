// Helpers shared by the sweep tests: a temporary directory, file I/O, and a sweep file over a
// one-layer base config.
#pragma once

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "remove_tree.h"
#include "sweep/sweep_spec.h"

namespace darkformer {
namespace sweep_test {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = (fs::temp_directory_path() / ("df_sweep_" + std::to_string(rd()))).string();
    fs::create_directories(path_);
  }
  ~TempDir() { darkformer::testing::RemoveTree(path_); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

inline std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline const char* kBaseConfig = R"(model:
  vocab_size: 64
  hidden_size: 16
  intermediate_size: 32
  num_hidden_layers: 1
  num_attention_heads: 2
  num_key_value_heads: 1
  head_dim: 8
data: {shards_dir: none, tokenizer: none.model}
train: {steps: 3}
)";

inline SweepSpec SpecIn(const TempDir& dir, const std::string& body) {
  Write(dir.File("base.yaml"), kBaseConfig);
  Write(dir.File("sweep.yaml"), "base: base.yaml\noutput: " + dir.File("out") + "\n" + body);
  return SweepSpec::Load(dir.File("sweep.yaml"));
}

}  // namespace sweep_test
}  // namespace darkformer
