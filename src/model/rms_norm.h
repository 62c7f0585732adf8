// Gemma's RMSNorm: computed in fp32 and scaled by (1 + w), as HF transformers and gemma_pytorch do.
#pragma once

#include <torch/torch.h>

namespace darkformer {

class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t dim, double eps);
  // Normalises over the last dimension; returns x's dtype.
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  // zero-initialised: (1 + w) starts as the identity scale

 private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

}  // namespace darkformer
