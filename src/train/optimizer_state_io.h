// AdamW state in a checkpoint, streamed one tensor at a time and keyed by parameter name (not by
// position), so that saving or restoring it never holds a second copy of the optimizer state, and
// a checkpoint stays readable whatever order the optimizer lists its parameters in.
//
// Layout, under the checkpoint's "trainer/adamw" group:
//   param_groups/<i>                   a group per param group, in the optimizer's order, with
//                                      attributes lr, beta1, beta2, eps, weight_decay (float64),
//                                      amsgrad (int64 0/1) and params (its parameter names, one a line)
//   state/<param name>/step            0-d int64: the parameter's AdamW step count
//   state/<param name>/exp_avg         the first and second moments, shaped like the parameter
//   state/<param name>/exp_avg_sq
//   state/<param name>/max_exp_avg_sq  only where it is defined (amsgrad)
// A parameter without state (none before its first step; frozen ones are not in the optimizer)
// has no state/ entry.
#pragma once

#include <torch/torch.h>

#include "model/gemma_model.h"
#include "model/h5_tensor_io.h"

namespace darkformer {

inline constexpr const char* kAdamWStateGroup = "trainer/adamw";

// Adds the datasets WriteAdamWState will write to `size`.
void EstimateAdamWState(const torch::optim::Optimizer& optimizer, H5SizeEstimate& size);

// Writes the state of an AdamW optimizer over `model`'s parameters; fails for another optimizer.
void WriteAdamWState(H5Writer& file, GemmaModelImpl& model, const torch::optim::Optimizer& optimizer);

// Restores exactly what WriteAdamWState wrote: param group options and every parameter's state
// (state the file lacks is removed). The whole layout is checked against the optimizer before
// anything changes; then each tensor is read into the optimizer's existing state tensor when that
// has the stored shape, dtype and device, or into one new tensor otherwise.
void ReadAdamWState(const H5Reader& file, GemmaModelImpl& model, torch::optim::Optimizer& optimizer);

}  // namespace darkformer
