// What the memory estimate's shadow forward (shadow_tape.h) needs to know about a layer's kernel,
// asked of the kernel built from the run config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/ops/feature_map.h"
#include "train/run_config.h"

namespace darkformer::shadow {

// What the model shadow needs to know about a layer's kernel.
struct KernelInfo {
  enum class Kind { kExact, kPositive, kGenericFeatures } kind = Kind::kExact;
  int64_t features = 0;     // m
  int64_t rank = 0;         // width of M q (darkformer); head_dim otherwise
  int64_t map_heads = 0;    // heads of the input map M (darkformer): H per head, 1 shared, 0 none
  int64_t chunk = 64;
  bool params_trainable = false;
  bool log_form = false;           // runs the causal operator (ops/), in the form `op` picks
  CausalOp op = CausalOp::kAuto;
  bool documents = false;          // data.document_masking on
  bool exact_mask = false;         // exact attention then masks (a B x 1 x L x L mask) instead of one call per document
};

// Whether a log-form kernel runs the chunk-parallel form, by the operator's own rule (the raw
// kernel takes positive features in fp32 on a CPU: the training path's case).
bool ChunkParallel(const KernelInfo& k, bool cpu);

// Builds layer `layer`'s kernel and reads its kind, sizes, form and whether train.trainable
// (`trainable`) reaches its parameters.
KernelInfo DescribeKernel(const RunConfig& c, int64_t layer, const std::vector<std::string>& trainable);

}  // namespace darkformer::shadow
