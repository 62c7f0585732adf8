// Gradient clipping by the global 2-norm, as torch.nn.utils.clip_grad_norm_ (foreach=True): one
// multi-tensor norm and one multi-tensor scale per device and dtype, where LibTorch's C++
// clip_grad_norm_ launches a norm and a scale per parameter and reads the norm back to the host.
// The norm stays on the device here, so the trainer reads it back with the step's loss in one copy.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace darkformer {

// Scales every defined gradient of `parameters` by min(1, max_norm / (norm + 1e-6)), as torch,
// and returns the global 2-norm before scaling: a 0-d tensor on the first gradient's device, fp32
// (fp64 where a gradient is fp64; 0 on the CPU when no parameter has a gradient). max_norm = inf
// scales nothing. A non-finite gradient gives a non-finite norm (and non-finite gradients after
// scaling, as torch's).
torch::Tensor ClipGradNorm(const std::vector<torch::Tensor>& parameters, double max_norm);

}  // namespace darkformer
