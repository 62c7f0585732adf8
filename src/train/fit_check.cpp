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

constexpr long double kInt64Max = static_cast<long double>(std::numeric_limits<int64_t>::max());

bool Trainable(const TrainConfig& train, const std::string& name) {
  for (const auto& glob : train.trainable) {
    if (fnmatch(glob.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

// The kernel options' num_features, read without building the kernel (0 when not set: the
// defaults are small, and leaving them out keeps the bound a lower bound).
int64_t ConfiguredFeatures(const AttentionConfig& attention, const std::string& kernel) {
  const auto node = attention.options[kernel];
  if (!node || !node.IsMap() || !node["num_features"] || !node["num_features"].IsScalar()) return 0;
  int64_t m = 0;
  return YAML::convert<int64_t>::decode(node["num_features"], m) && m > 0 ? m : 0;
}

// "13.2 GiB", also for sizes far beyond int64.
std::string HumanBytes(long double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 6) {
    bytes /= 1024;
    ++unit;
  }
  if (bytes >= 1e6L) return fmt::format("{:.3g} EiB", static_cast<double>(bytes));
  return fmt::format("{:.1f} {}", static_cast<double>(bytes), units[unit]);
}

// /proc/meminfo's MemAvailable in bytes (0 when unreadable).
int64_t MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// A cgroup v2 (or v1) memory limit minus what the cgroup already uses; max() when unlimited.
int64_t CgroupHeadroom() {
  auto read = [](const char* path) -> std::optional<int64_t> {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text) || text == "max") return std::nullopt;
    try {
      return std::stoll(text);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  for (const auto& [limit_path, usage_path] :
       {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        std::pair{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const auto limit = read(limit_path);
    // cgroup v1 reports "no limit" as a huge page-aligned number.
    if (!limit || *limit >= (int64_t{1} << 60)) continue;
    return std::max<int64_t>(0, *limit - read(usage_path).value_or(0));
  }
  return std::numeric_limits<int64_t>::max();
}

}  // namespace

long double SizeTerm::Bytes() const {
  long double bytes = multiplier;
  for (const auto& [key, value] : factors) bytes *= static_cast<long double>(value);
  return bytes;
}

const std::pair<std::string, int64_t>& SizeTerm::DominantFactor() const {
  return *std::max_element(factors.begin(), factors.end(),
                           [](const auto& a, const auto& b) { return a.second < b.second; });
}

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

int64_t AvailableDeviceMemory(const torch::Device& device) {
  if (device.is_cuda()) {
    size_t free = 0, total = 0;
    int previous = 0;
    cudaGetDevice(&previous);
    if (device.has_index()) cudaSetDevice(device.index());
    const bool ok = cudaMemGetInfo(&free, &total) == cudaSuccess;
    cudaSetDevice(previous);
    return ok ? static_cast<int64_t>(free) : 0;
  }
  const int64_t available = MemAvailable();
  return available > 0 ? std::min(available, CgroupHeadroom()) : 0;
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

void CheckKernelDrawsFit(const AttentionConfig& attention, const GemmaConfig& model) {
  const int64_t free = AvailableDeviceMemory(torch::Device(torch::kCPU));
  for (const auto& name : KernelNames()) {
    const int64_t features = ConfiguredFeatures(attention, name);
    if (features == 0) continue;
    const SizeTerm term{"the " + name + " feature projection of one layer",
                        {{attention.path + "." + name + ".num_features", features}, {"model.head_dim", model.head_dim}}, 4};
    const long double bytes = term.Bytes();
    if (bytes <= kInt64Max && (free <= 0 || bytes <= static_cast<long double>(free))) continue;
    const auto& [key, value] = term.DominantFactor();
    Fail(fmt::format("config key '{}' = {} makes the run too large: {} alone would take {}; {}", key, value,
                     term.what, HumanBytes(bytes),
                     bytes > kInt64Max ? std::string("more than any device can address")
                                       : "the memory this machine has available is " + HumanBytes(free)));
  }
}

void CheckKernelOptionsFit(const std::string& kernel, const YAML::Node& options, int64_t head_dim, int64_t batch,
                           int64_t heads, int64_t max_length, const torch::Device& device) {
  AttentionConfig attention;
  attention.options = YAML::Node(YAML::NodeType::Map);
  attention.options[kernel] = YAML::Clone(options);
  GemmaConfig model;
  model.head_dim = head_dim;
  CheckKernelDrawsFit(attention, model);
  const int64_t features = ConfiguredFeatures(attention, kernel);
  if (features == 0 || max_length <= 0) return;
  const SizeTerm term{"one feature map",
                      {{attention.path + "." + kernel + ".num_features", features},
                       {"batch", batch}, {"heads", heads}, {"length", max_length}}, 4};
  const long double bytes = term.Bytes();
  const int64_t free = AvailableDeviceMemory(device);
  if (bytes <= kInt64Max && (free <= 0 || bytes <= static_cast<long double>(free))) return;
  Fail(fmt::format("config key '{}' = {} is too large for batch {}, {} heads and length {}: one feature map alone "
                   "would take {}; {}", term.factors[0].first, features, batch, heads, max_length, HumanBytes(bytes),
                   bytes > kInt64Max ? std::string("more than any device can address")
                                     : "the " + device.str() + " has " + HumanBytes(free) + " available"));
}

}  // namespace darkformer
