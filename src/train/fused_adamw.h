// AdamW whose update is LibTorch's fused kernel (at::_fused_adamw_, as torch.optim.AdamW's
// fused=True): one pass over each parameter, its gradient and its two moments, where
// torch::optim::AdamW launches about seven elementwise ops per parameter and allocates a
// parameter-sized denominator. The same state (AdamWParamState: step, exp_avg, exp_avg_sq), so
// checkpoints read and write it as before (optimizer_state_io.h); the same update up to rounding
// (tests/cuda/fused_adamw_test.cpp, on the CPU and the GPU).
#pragma once

#include <torch/torch.h>

#include <vector>

namespace darkformer {

class FusedAdamW : public torch::optim::AdamW {
 public:
  FusedAdamW(const std::vector<torch::optim::OptimizerParamGroup>& groups, const torch::optim::AdamWOptions& defaults)
      : torch::optim::AdamW(groups, defaults) {}

  // One fused call per parameter group; parameters without a gradient are left alone, as
  // torch::optim::AdamW leaves them. amsgrad is refused (no key sets it).
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace darkformer
