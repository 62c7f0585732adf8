// Building a model from a run config and its weights (see model_loading.h).
#include "train/model_loading.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "model/weights_io.h"
#include "train/checkpoint.h"
#include "train/fit_check.h"
#include "util/error.h"

namespace darkformer {

namespace fs = std::filesystem;

torch::Device ResolveDevice(const RunConfig& config) {
  const auto device = config.train.device;
  if (device == TrainDevice::kCuda || (device == TrainDevice::kAuto && torch::cuda::is_available())) {
    DF_CHECK(torch::cuda::is_available(), "config key 'train.device' is cuda, but no CUDA device is available");
    return torch::Device(torch::kCUDA);
  }
  return torch::Device(torch::kCPU);
}

void ApplyTf32(const std::string& tf32, const torch::Device& device) {
  DF_CHECK(tf32 != "true" || device.is_cuda(),
           "config key 'train.tf32' is true, but the run is on the CPU, which has no TF32 (use auto or false)");
  if (!device.is_cuda()) return;
  const bool allow = tf32 != "false";
  at::globalContext().setAllowTF32CuBLAS(allow);
  at::globalContext().setAllowTF32CuDNN(allow);
  spdlog::info("TF32 for fp32 matmuls on CUDA: {}", allow ? "on" : "off");
}

std::string ResolveWeightsPath(const std::string& path, const std::string& what) {
  DF_CHECK(fs::exists(path), what << ": " << path << " does not exist");
  if (!fs::is_directory(path)) return path;
  const auto latest = LatestCheckpoint(path);
  DF_CHECK(latest, what << ": run directory " << path << " has no checkpoint");
  return *latest;
}

GemmaModel BuildModelFrom(const RunConfig& config, const std::string& weights, const std::string& what) {
  // Before anything is allocated: sizes that cannot fit are refused with the key that makes them.
  CheckRunFits(config, Workload::kForward, ResolveDevice(config));
  torch::manual_seed(config.train.seed);
  GemmaModel model(config.model, config.attention);
  if (weights.empty()) {
    model->InitializeWeights(config.train.init_std, config.train.seed);
    return model;
  }
  const auto path = ResolveWeightsPath(weights, what);
  LoadWeights(path, *model, {.kernel_state_optional = true});
  spdlog::info("initialised from {}", path);
  return model;
}

}  // namespace darkformer
