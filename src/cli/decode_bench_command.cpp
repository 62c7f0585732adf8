// `darkformer decode-bench --config run.yaml [--contexts 128,512,...] [--steps N] [--json F]`:
// per-token decoding latency, decoding-state bytes and peak memory after a prompt of each context
// length, for the config's model and kernel (random weights: timing does not depend on them).
// A benchmark, not a test: run on a quiet machine; compare kernels with the same config.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "cli/commands.h"
#include "util/peak_memory.h"
#include "train/model_loading.h"
#include "util/error.h"
#include "util/mixed_precision.h"
#include "util/json_lines.h"

namespace darkformer {

namespace {

struct DecodeBenchArgs {
  std::string config_path, json;
  std::vector<std::string> overrides;
  std::vector<int64_t> contexts = {128, 512, 2048, 8192};
  int64_t steps = 32;
};

double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void RunDecodeBench(const DecodeBenchArgs& a) {
  DF_CHECK(a.steps > 0, "--steps must be positive, got " << a.steps);
  const auto config = RunConfig::Load(a.config_path, a.overrides);
  if (config.train.threads > 0) torch::set_num_threads(static_cast<int>(config.train.threads));
  JsonLinesFile json(a.json);  // before the model is built or anything timed
  auto model = BuildModelFrom(config, "", "decode-bench");
  const auto device = ResolveDevice(config);
  ApplyTf32(config.train.tf32, device);
  model->to(device);
  model->eval();
  torch::NoGradGuard no_grad;
  // Decoding at the run's precision (train.precision), as generate does.
  const bool bf16 = config.train.precision == Precision::kBf16Autocast;
  AutocastScope autocast(device.type(), bf16);
  const auto vocab = model->config().vocab_size;
  std::cout << fmt::format("decoding, {} attention, {} layers, hidden {}, {}, {} intra-op threads; ms/token = median "
                           "of {} single-token steps after the prompt\n",
                           config.attention.kernel, model->config().num_hidden_layers, model->config().hidden_size,
                           bf16 ? "bf16 autocast" : "fp32", torch::get_num_threads(), a.steps);
  std::cout << fmt::format("{:>8} {:>11} {:>10} {:>12} {:>14}\n", "context", "prefill ms", "ms/token", "state MiB",
                           "step peak MiB");
  using Clock = std::chrono::steady_clock;
  for (const int64_t context : a.contexts) {
    auto cache = model->NewDecodeCache(context + a.steps, device);
    const auto prompt = torch::randint(0, vocab, {1, context}, torch::kLong).to(device);
    auto start = Clock::now();
    model->ForwardDecode(prompt, cache);
    const double prefill_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    std::vector<double> step_ms;
    auto info = std::make_shared<PeakMemory>();
    {
      c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, info);
      for (int64_t s = 0; s < a.steps; ++s) {
        const auto token = torch::randint(0, vocab, {1, 1}, torch::kLong).to(device);
        start = Clock::now();
        model->ForwardDecode(token, cache);
        step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      }
    }
    const double state_mib = cache.StateBytes() / (1024.0 * 1024.0), ms = MedianOf(step_ms);
    std::cout << fmt::format("{:>8} {:>11.1f} {:>10.2f} {:>12.3f} {:>14.2f}\n", context, prefill_ms, ms, state_mib,
                             info->peak_mib());
    json.Write({{"kernel", config.attention.kernel}, {"context", context}, {"prefill_ms", prefill_ms},
                {"ms_per_token", ms}, {"ms_all", step_ms}, {"state_mib", state_mib},
                {"step_peak_mib", info->peak_mib()}, {"threads", torch::get_num_threads()}});
    std::cout << std::flush;
  }
}

}  // namespace

void AddDecodeBenchCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("decode-bench", "Benchmark per-token decoding latency and state size by context");
  static DecodeBenchArgs a;
  cmd->add_option("--config", a.config_path, "run config YAML (its model and attention)")->required();
  cmd->add_option("--contexts", a.contexts, "prompt lengths (default 128,512,2048,8192)")->delimiter(',');
  cmd->add_option("--steps", a.steps, "timed single-token steps per context (default 32)");
  cmd->add_option("--json", a.json, "write one JSON line per context here");
  cmd->add_option("--set", a.overrides, "override a config key: a.b.c=value (repeatable)");
  cmd->callback([] { RunDecodeBench(a); });
}

}  // namespace darkformer
