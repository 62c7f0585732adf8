// GeGLU feed-forward (see gated_mlp.h).
#include "model/gated_mlp.h"

namespace darkformer {

GatedMlpImpl::GatedMlpImpl(int64_t hidden_size, int64_t intermediate_size) {
  auto linear = [](int64_t in, int64_t out) { return torch::nn::LinearOptions(in, out).bias(false); };
  gate_proj = register_module("gate_proj", torch::nn::Linear(linear(hidden_size, intermediate_size)));
  up_proj = register_module("up_proj", torch::nn::Linear(linear(hidden_size, intermediate_size)));
  down_proj = register_module("down_proj", torch::nn::Linear(linear(intermediate_size, hidden_size)));
}

torch::Tensor GatedMlpImpl::forward(const torch::Tensor& x_BLE) {
  return down_proj(torch::gelu(gate_proj(x_BLE), "tanh") * up_proj(x_BLE));
}

}  // namespace darkformer
