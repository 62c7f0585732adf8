// Sizes from config values, and the kernels' draws checked against them (see size_terms.h).
#include "train/size_terms.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <optional>

#include "attention/kernel_registry.h"
#include "util/error.h"

namespace darkformer {

namespace {

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

int64_t ConfiguredFeatures(const AttentionConfig& attention, const std::string& kernel) {
  const auto node = attention.options[kernel];
  if (!node || !node.IsMap() || !node["num_features"] || !node["num_features"].IsScalar()) return 0;
  int64_t m = 0;
  return YAML::convert<int64_t>::decode(node["num_features"], m) && m > 0 ? m : 0;
}

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

long double SizeTerm::Bytes() const {
  long double bytes = multiplier;
  for (const auto& [key, value] : factors) bytes *= static_cast<long double>(value);
  return bytes;
}

const std::pair<std::string, int64_t>& SizeTerm::DominantFactor() const {
  return *std::max_element(factors.begin(), factors.end(),
                           [](const auto& a, const auto& b) { return a.second < b.second; });
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
