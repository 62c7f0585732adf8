// `darkformer inspect`: parameter counts per component of a model config or weights file.
#include <fmt/format.h>

#include <iostream>

#include "cli/commands.h"
#include "model/model_spec.h"
#include "model/parameter_count.h"
#include "model/weights_io.h"

namespace darkformer {

namespace {

std::string WithCommas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void PrintCounts(const ModelSpec& spec, const std::string& origin) {
  const auto c = CountParameters(spec.model, spec.attention);
  const auto& m = spec.model;
  std::cout << fmt::format("{}: {} with {} layers, hidden {}, {} heads ({} kv) x {}, MLP {}, vocab {}\n", origin,
                           m.family, m.num_hidden_layers, m.hidden_size, m.num_attention_heads,
                           m.num_key_value_heads, m.head_dim, m.intermediate_size, m.vocab_size);
  const auto row = [](const std::string& name, int64_t n) {
    std::cout << fmt::format("  {:<34} {:>17}\n", name, WithCommas(n));
  };
  row("embedding (tied LM head)", c.embedding);
  row("attention (q/k/v/o" + std::string(m.Family() == GemmaFamily::kGemma3 ? ", q/k norms)" : ")"), c.attention);
  row("mlp (gate/up/down)", c.mlp);
  row("norms", c.norms);
  row("attention kernels (" + spec.attention.kernel + ")", c.kernel);
  row("total", c.Total());
}

}  // namespace

void AddInspectCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Print parameter counts per component of a model");
  static std::string config_path, weights_path;
  auto* config_opt = cmd->add_option("--config", config_path, "model YAML (configs/model/*.yaml) or run config");
  auto* weights_opt = cmd->add_option("--weights", weights_path, "an HDF5 weights file (its stored config)");
  config_opt->excludes(weights_opt);
  cmd->callback([] {
    if (!weights_path.empty()) {
      PrintCounts(ModelSpec{ReadWeightsConfig(weights_path), {}}, weights_path);
    } else {
      DF_CHECK(!config_path.empty(), "inspect needs --config or --weights");
      PrintCounts(ReadModelSpec(config_path), config_path);
    }
  });
}

}  // namespace darkformer
