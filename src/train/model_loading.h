// The model a run config describes, with its weights: from scratch, from converted HF weights or
// from one of our checkpoints (a run directory means its newest checkpoint). Shared by training,
// evaluation and generation.
#pragma once

#include <string>

#include "model/gemma_model.h"
#include "train/run_config.h"

namespace darkformer {

// The device train.device names (auto: CUDA when available).
torch::Device ResolveDevice(const RunConfig& config);
// train.tf32 on `device`: auto/true allow TF32 in CUDA's fp32 matmuls and convolutions, false
// forbids it; true for a CPU run is an error (the CPU has no TF32, so the key would do nothing).
void ApplyTf32(const std::string& tf32, const torch::Device& device);

// The weights file `path` stands for: itself, or a run directory's newest checkpoint. `what`
// names the source in errors (a config key path or a flag).
std::string ResolveWeightsPath(const std::string& path, const std::string& what);

// Builds config.model with config.attention's kernels and loads `weights` (resolved as above;
// empty: HF-style init from train.init_std and train.seed). A kernel other than the weights'
// keeps the initialisation its options give (the paper's finetuning swap).
GemmaModel BuildModelFrom(const RunConfig& config, const std::string& weights, const std::string& what);

}  // namespace darkformer
