// `darkformer inspect`: parameter counts per component of a model config or weights file.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>

#include "attention/kernel_traits.h"
#include "cli/commands.h"
#include "model/model_spec.h"
#include "model/parameter_count.h"
#include "model/weights_io.h"
#include "train/memory_estimate.h"
#include "train/run_config.h"
#include "sweep/sweep_status.h"
#include "util/json.h"

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

// `--memory`: the run config's training memory per device (train/memory_estimate.h).
void PrintMemory(const std::string& path, const std::vector<std::string>& overrides, int64_t devices) {
  DF_CHECK(devices > 0, "--devices must be a positive number of devices, got " << devices);
  DF_CHECK(std::filesystem::is_regular_file(path), "config file not found: " << path);
  const auto root = YAML::LoadFile(path);
  for (const char* section : {"model", "data", "train"}) {
    DF_CHECK(root[section] || root["base"],
             "inspect --memory needs a run config (sections model, data, train: data.batch_size, data.seq_len, "
             "train.precision, ...); " << path << " has no '" << section << "' section");
  }
  const auto config = RunConfig::Load(path, overrides);
  DF_CHECK(config.resolved["data"] && config.resolved["train"] && config.resolved["model"],
           "inspect --memory needs a run config with sections model, data and train; "
               << path << " lacks " << (!config.resolved["model"] ? "'model'" : !config.resolved["data"] ? "'data'" : "'train'")
               << " (after its base: files)");
  MemoryEstimateOptions options;
  options.devices = devices;
  options.cpu = config.train.device == TrainDevice::kCpu;
  const auto e = EstimateTrainingMemory(config, options);
  const auto& t = config.train;
  std::cout << fmt::format(
      "{}: training memory per device ({} device{}), {}, {} layers, kernel {}\n"
      "  micro-batch {} rows x {} tokens = {} tokens; grad_accum {} -> {} tokens per step per device\n"
      "  precision {}, activation checkpointing {}, loss {}\n"
      "  parameters {} ({} trainable)\n",
      path, devices, devices == 1 ? "" : "s", config.model.family, config.model.num_hidden_layers,
      config.attention.kernel, e.micro_batch_rows, config.data.seq_len, e.tokens_per_micro_batch, t.grad_accum,
      e.tokens_per_step, t.precision == Precision::kBf16Autocast ? "bf16_autocast" : "float32",
      t.activation_checkpointing ? "on" : "off",
      t.loss_chunk_tokens > 0 ? "chunked (" + std::to_string(t.loss_chunk_tokens) + " tokens)" : "full logits",
      WithCommas(e.parameters), WithCommas(e.trainable_parameters));
  const auto row = [](const std::string& name, int64_t bytes) {
    std::cout << fmt::format("  {:<44} {}\n", name, FormatBytes(bytes));
  };
  row("weights (fp32, kernel buffers included)", e.weights);
  row("gradients (trainable, fp32)", e.gradients);
  row("optimizer state (AdamW, 2 x fp32)", e.optimizer);
  row(std::string("activations, all layers kept") + (e.checkpointing ? "" : "  <- applies"), e.activations_full);
  row(std::string("activations, checkpointed") + (e.checkpointing ? "  <- applies" : ""), e.activations_checkpointed);
  row("saved outside the layers (final norm, ids)", e.outside_layers);
  row("logits / loss buffers", e.loss_buffers);
  row("backward transient (worst)", e.backward_transient);
  if (e.cublas_workspaces > 0) row("cuBLAS workspaces (GPU, every phase)", e.cublas_workspaces);
  std::cout << "  phases:\n";
  for (const auto& p : e.phases) row("  " + p.name, p.bytes);
  row("predicted peak", e.peak);
  std::cout << fmt::format("  (at: {})\n", e.peak_phase);
  for (const auto& note : e.notes) std::cout << "  note: " << note << "\n";
  std::cout << "  an estimate from the config (tests/cuda/memory_estimate_test.cpp: within 15% of the "
               "allocator's peak on the CPU and on an H200; docs/gpu.md: 8% above it for a Gemma 2B q/k/v step)\n";
}

void PrintKernels(bool json) {
  for (const auto& t : AllKernelTraits()) {
    if (json) {
      std::cout << ToJson(t).dump() << "\n";
      continue;
    }
    std::string options;
    for (const auto& [key, value] : t.option_defaults) options += (options.empty() ? "" : ", ") + key + ": " + value;
    std::cout << fmt::format("{:<11} {:<9} {:<8} learns [{}]\n{:<11} options {{{}}}\n", t.name, KernelFamilyName(t.family),
                             t.log_form ? "log-form" : "", fmt::join(t.learns, ", "), "", options);
  }
}

}  // namespace

void AddInspectCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Print parameter counts per component of a model");
  static std::string config_path, weights_path;
  auto* config_opt = cmd->add_option("--config", config_path, "model YAML (configs/model/*.yaml) or run config");
  auto* weights_opt = cmd->add_option("--weights", weights_path, "an HDF5 weights file (its stored config)");
  config_opt->excludes(weights_opt);
  static bool memory = false;
  static int64_t devices = 1;
  auto* memory_opt = cmd->add_flag("--memory", memory,
                                   "training memory per device of a run config (weights, gradients, AdamW, "
                                   "activations, loss buffers, predicted peak)");
  auto* devices_opt = cmd->add_option("--devices", devices, "data-parallel devices sharing data.batch_size (with --memory)");
  devices_opt->needs(memory_opt);
  static std::vector<std::string> overrides;
  cmd->add_option("--set", overrides, "override a run-config key (a.b.c=value), with --memory")->needs(memory_opt);
  memory_opt->excludes(weights_opt);
  static bool kernels = false, json = false;
  auto* kernels_opt = cmd->add_flag("--kernels", kernels,
                                    "the registered attention kernels: family, forms, what each learns, its options' defaults");
  cmd->add_flag("--json", json, "with --kernels: one JSON object per kernel per line (read by tools/ and the plug-in's tests)")
      ->needs(kernels_opt);
  kernels_opt->excludes(config_opt)->excludes(weights_opt)->excludes(memory_opt);
  static std::vector<std::string> run_dirs;
  cmd->add_option("--run-status", run_dirs,
                  "run directories: one JSON line each, {\"run\": dir, \"status\": finished | diverged | failed | "
                  "partial | pending}, as the sweep runner classifies them (read by tools/run_loading.py)")
      ->excludes(kernels_opt)
      ->excludes(config_opt)
      ->excludes(weights_opt)
      ->excludes(memory_opt);
  cmd->callback([] {
    if (!run_dirs.empty()) {
      for (const auto& dir : run_dirs) std::cout << Json{{"run", dir}, {"status", RunStatusName(StatusOfRunDir(dir))}}.dump() << "\n";
    } else if (kernels) {
      PrintKernels(json);
    } else if (memory) {
      DF_CHECK(!config_path.empty(), "inspect --memory needs --config run.yaml");
      PrintMemory(config_path, overrides, devices);
    } else if (!weights_path.empty()) {
      PrintCounts(ModelSpec{ReadWeightsConfig(weights_path), {}}, weights_path);
    } else {
      DF_CHECK(!config_path.empty(), "inspect needs --config or --weights");
      PrintCounts(ReadModelSpec(config_path), config_path);
    }
  });
}

}  // namespace darkformer
