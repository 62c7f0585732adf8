// Refusing runs that cannot fit, before allocating (see fit_check.h).
#include "train/fit_check.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <fnmatch.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "attention/kernel_registry.h"
#include "train/memory_estimate.h"
#include "util/error.h"

namespace darkformer {

namespace {

bool Trainable(const TrainConfig& train, const std::string& name) {
  for (const auto& glob : train.trainable) {
    if (fnmatch(glob.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

}  // namespace

std::vector<SizeTerm> LowerBoundTerms(const RunConfig& config, Workload workload, int64_t devices) {
  const auto& m = config.model;
  const bool train = workload == Workload::kTrain;
  // fp32 weights (the model is built in fp32, whatever it later stores); training adds the
  // gradient and AdamW's two moments of every trainable one.
  auto per_weight = [&](const std::string& name) -> long double {
    return train && Trainable(config.train, name) ? 16 : 4;
  };
  const std::pair<std::string, int64_t> V{"model.vocab_size", m.vocab_size}, H{"model.hidden_size", m.hidden_size},
      I{"model.intermediate_size", m.intermediate_size}, N{"model.num_hidden_layers", m.num_hidden_layers},
      heads{"model.num_attention_heads", m.num_attention_heads}, kv{"model.num_key_value_heads", m.num_key_value_heads},
      hd{"model.head_dim", m.head_dim};
  std::vector<SizeTerm> terms = {
      {"the embedding", {V, H}, per_weight("embed_tokens.weight")},
      {"the q and o projections", {N, H, heads, hd}, per_weight("layers.0.self_attn.q_proj.weight") +
                                                         per_weight("layers.0.self_attn.o_proj.weight")},
      {"the k and v projections", {N, H, kv, hd}, per_weight("layers.0.self_attn.k_proj.weight") +
                                                      per_weight("layers.0.self_attn.v_proj.weight")},
      {"the MLP weights", {N, H, I}, per_weight("layers.0.mlp.gate_proj.weight") +
                                         per_weight("layers.0.mlp.up_proj.weight") +
                                         per_weight("layers.0.mlp.down_proj.weight")},
  };
  // The random-feature kernels' projections: at least m x head_dim fp32 per layer that uses one.
  for (int64_t layer = 0; layer < std::min<int64_t>(m.num_hidden_layers, 1 << 20); ++layer) {
    const auto kernel = config.attention.KernelForLayer(layer);
    const int64_t features = ConfiguredFeatures(config.attention, kernel);
    if (features == 0) continue;
    const std::string key = config.attention.path + "." + kernel + ".num_features";
    bool merged = false;
    for (auto& t : terms) {
      if (!t.factors.empty() && t.factors.front().first == key) {
        t.multiplier += 4;  // one more layer with this kernel
        merged = true;
      }
    }
    if (!merged) terms.push_back({"the " + kernel + " feature projections", {{key, features}, hd}, 4});
  }
  // Activations: training keeps at least each layer's input for the backward (the residual stream
  // stays fp32); any forward holds one batch's hidden states.
  // One micro-batch's rows: grad_accum micro-batches run one after another, each this size.
  const std::pair<std::string, int64_t> B{"data.batch_size", MicroBatchRows(config.data, devices)},
      L{"data.seq_len", config.data.seq_len};
  // Logits: the full-logit training loss materialises batch x seq_len x vocab fp32 (a chunked
  // loss, train.loss_chunk_tokens, does not).
  if (train && config.train.loss_chunk_tokens == 0) terms.push_back({"the logits", {B, L, V}, 4, true});
  if (train) {
    terms.push_back({"the layer inputs saved for the backward", {B, L, H, N}, 4, true});
  } else {
    terms.push_back({"one batch's hidden states", {B, L, H}, 4, true});
  }
  terms.erase(std::remove_if(terms.begin(), terms.end(), [](const SizeTerm& t) { return t.Bytes() <= 0; }), terms.end());
  return terms;
}

void CheckRunFits(const RunConfig& config, Workload workload, const torch::Device& device, int64_t devices,
                  int64_t ranks_sharing_memory) {
  const auto terms = LowerBoundTerms(config, workload, devices);
  long double total = 0;
  for (const auto& t : terms) total += t.Bytes();
  auto largest_of = [&](auto&& keep) -> const SizeTerm& {
    const SizeTerm* best = &terms.front();
    for (const auto& t : terms) {
      if (keep(t) && (!keep(*best) || t.Bytes() > best->Bytes())) best = &t;
    }
    return *best;
  };
  const auto& largest = largest_of([](const SizeTerm&) { return true; });
  const int64_t free = AvailableDeviceMemory(device) / std::max<int64_t>(1, ranks_sharing_memory);
  const std::string where = device.is_cuda() ? "the GPU's free memory" : "the memory this machine has available";
  auto refuse = [&](const SizeTerm& term, const std::string& because) {
    const auto& [key, value] = term.DominantFactor();
    Fail(fmt::format("config key '{}' = {} makes the run too large: {} alone would take {}; {}", key, value, term.what,
                     HumanBytes(term.Bytes()), because));
  };
  // Beyond int64 no tensor can even be described, whatever the device.
  if (total > kInt64Max) {
    refuse(largest, fmt::format("at least {} in all, more than any device can address", HumanBytes(total)));
  }
  if (free > 0 && total > static_cast<long double>(free)) {
    refuse(largest, fmt::format("at least {} in all, but {} is {}", HumanBytes(total), where, HumanBytes(free)));
  }
  if (workload != Workload::kTrain || free <= 0 || !config.train.memory_check) return;
  const auto e = EstimateTrainingMemory(config, {.devices = devices, .cpu = !device.is_cuda()});
  if (e.peak <= free) return;
  // Name what dominates the estimate: the weights with their optimizer state, or the activations.
  const int64_t weights = e.weights + e.gradients + e.optimizer;
  const bool weights_dominate = weights >= e.peak - weights;
  const auto& culprit = largest_of([&](const SizeTerm& t) { return t.activation != weights_dominate; });
  refuse(culprit, fmt::format("the run's estimated peak is {} at {} (docs/memory.md), but {} is {}; set "
                              "train.memory_check: false to start it anyway",
                              FormatBytes(e.peak), e.peak_phase, where, HumanBytes(free)));
}

}  // namespace darkformer
