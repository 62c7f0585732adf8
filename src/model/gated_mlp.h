// Gemma's feed-forward block: GeGLU with tanh-approximated GELU, down(gelu(gate(x)) * up(x)).
#pragma once

#include <torch/torch.h>

namespace darkformer {

class GatedMlpImpl : public torch::nn::Module {
 public:
  GatedMlpImpl(int64_t hidden_size, int64_t intermediate_size);
  torch::Tensor forward(const torch::Tensor& x_BLE);

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(GatedMlp);

}  // namespace darkformer
