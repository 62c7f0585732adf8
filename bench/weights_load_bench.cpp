// weights_load_bench: what verifying checksums and finiteness costs a load. Saves one model twice,
// checksummed (chunked, Fletcher32, FNV-1a of string attributes) and in the layout from before
// checksums, then alternates LoadWeights of the two and reports the medians and their ratio. Both
// files are read from the page cache after the first pass, so the ratio is the CPU cost of the
// verification against a load's own; --drop-caches times loads from disk instead. A benchmark,
// not a test.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include "model/gemma_model.h"
#include "model/weights_io.h"

namespace {

using darkformer::GemmaConfig;
using darkformer::GemmaModel;

double Seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weights_load_bench: load time with and without checksums"};
  int64_t hidden = 1024, layers = 8, vocab = 32768, repeat = 5;
  std::string dir = std::filesystem::temp_directory_path() / "weights_load_bench";
  app.add_option("--hidden", hidden, "model.hidden_size (intermediate: 4x)");
  app.add_option("--layers", layers, "model.num_hidden_layers");
  app.add_option("--vocab", vocab, "model.vocab_size");
  app.add_option("--repeat", repeat, "timed loads of each file");
  app.add_option("--dir", dir, "where the two files are written (removed at the end)");
  bool cold = false;
  app.add_flag("--drop-caches", cold, "drop the page cache before each timed load (root): loads from disk");
  CLI11_PARSE(app, argc, argv);

  GemmaConfig c;
  c.family = "gemma";
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = 4 * hidden;
  c.num_hidden_layers = layers;
  c.num_attention_heads = hidden / 128;
  c.num_key_value_heads = 1;
  c.head_dim = 128;
  c.Finalize();
  GemmaModel model(c);
  model->InitializeWeights(0.02, 1);
  std::map<std::string, torch::Tensor> state;
  int64_t bytes = 0;
  for (const auto& item : model->named_parameters()) {
    state[item.key()] = item.value();
    bytes += item.value().nbytes();
  }
  std::filesystem::create_directories(dir);
  const std::string checked = dir + "/checked.h5", legacy = dir + "/legacy.h5";
  const std::map<std::string, std::string> attributes = {{"format", "darkformer-weights"},
                                                         {"config_yaml", c.ToYamlText()}};
  const double save_checked = Seconds([&] { darkformer::WriteTensorsH5(checked, state, attributes, {{"format_version", 1}}); });
  const double save_legacy = Seconds([&] {
    darkformer::WriteTensorsH5(legacy, state, attributes, {{"format_version", 1}}, {.checksums = false});
  });
  std::printf("model: %.1f MB of fp32 weights; file sizes: checksummed %.1f MB, without %.1f MB\n", bytes / 1e6,
              std::filesystem::file_size(checked) / 1e6, std::filesystem::file_size(legacy) / 1e6);
  std::printf("save once: checksummed %.3f s, without %.3f s (ratio %.2f)\n", save_checked, save_legacy,
              save_checked / save_legacy);

  GemmaModel target(c);
  std::vector<double> with, without;
  darkformer::LoadWeights(legacy, *target);  // warm the page cache and the note
  darkformer::LoadWeights(checked, *target);
  auto drop = [&] {
    if (!cold) return;
    std::ofstream("/proc/sys/vm/drop_caches") << "3\n";  // after sync, so the files are on disk
  };
  ::sync();
  for (int64_t r = 0; r < repeat; ++r) {  // alternate, so drift hits both alike
    drop();
    without.push_back(Seconds([&] { darkformer::LoadWeights(legacy, *target); }));
    drop();
    with.push_back(Seconds([&] { darkformer::LoadWeights(checked, *target); }));
    std::printf("pass %lld: checksummed %.3f s, without %.3f s\n", static_cast<long long>(r), with.back(), without.back());
  }
  // The finiteness check runs in both loads: its own share, timed alone on the loaded weights.
  std::vector<double> finite;
  for (int64_t r = 0; r < repeat; ++r) {
    finite.push_back(Seconds([&] {
      for (const auto& item : target->named_parameters()) darkformer::CheckFinite(item.value(), checked, item.key());
    }));
  }
  std::printf("finiteness check alone (in both loads): median %.3f s\n", Median(finite));
  std::printf("median load: checksummed %.3f s (%.0f MB/s), without %.3f s (%.0f MB/s); ratio %.2f\n", Median(with),
              bytes / Median(with) / 1e6, Median(without), bytes / Median(without) / 1e6, Median(with) / Median(without));
  std::filesystem::remove_all(dir);
  return 0;
}
