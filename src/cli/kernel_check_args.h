// kernel-check's arguments, and its two checks on a checkpoint's own queries and keys
// (kernel_check_weights.cpp); the synthetic checks and the command are kernel_check_command.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/kernel_diagnostics.h"
#include "cli/kernel_bench.h"
#include "util/json_lines.h"

namespace darkformer {

struct KernelCheckArgs {
  std::string kernel = "performer";
  std::string options = "{}";   // the kernel's YAML options section, inline
  int64_t heads = 8, head_dim = 64, length = 512, draws = 200;
  double norm = 1.0;             // row norm of x = sqrt(s) q and y = sqrt(s) k
  uint64_t seed = 0;
  bool bench = false;
  KernelBenchOptions bench_options;
  // (a) --estimators: synthetic q, k ~ N(0, Lambda).
  bool estimators = false;
  SyntheticEstimatorOptions synthetic;
  std::vector<int64_t> num_features = {16, 64, 256};
  // (b) --weights: per-layer diagnostics of a checkpoint on one batch of shards or a text file.
  std::string weights, shards, text, ids, tokenizer, split = "val";
  std::vector<std::string> kernels = {"performer", "darkformer", "lfk"};
  int64_t seq_len = 256, batch = 1;
  std::string json;  // JSON lines file for (a) or (b)
};

// After a check: where its --json lines went (nothing when no path was given).
void SayWritten(const JsonLinesFile& json);

// --weights: per layer, anisotropy of x = sqrt(s) q and y = sqrt(s) k and each kernel's output error.
void ModelDiagnostics(const KernelCheckArgs& a);

// --estimators --weights: per layer, the FAVOR estimators of exp(x.y) on the checkpoint's own x, y.
void FavorEstimators(const KernelCheckArgs& a);

}  // namespace darkformer
