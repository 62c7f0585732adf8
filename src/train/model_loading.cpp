// Building a model from a run config and its weights (see model_loading.h).
#include "train/model_loading.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "model/weights_io.h"
#include "train/checkpoint.h"
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

std::string ResolveWeightsPath(const std::string& path, const std::string& what) {
  DF_CHECK(fs::exists(path), what << ": " << path << " does not exist");
  if (!fs::is_directory(path)) return path;
  const auto latest = LatestCheckpoint(path);
  DF_CHECK(latest, what << ": run directory " << path << " has no checkpoint");
  return *latest;
}

GemmaModel BuildModelFrom(const RunConfig& config, const std::string& weights, const std::string& what) {
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
