// Bytes an operator's autograd node holds for its backward (saved tensors): for the memory tests
// and the benchmark. Each form's own XSavedBytes asks with its Function type.
#pragma once

#include <torch/torch.h>

namespace darkformer::causal_ops {

// 0 when `out` was not produced by `Function` with gradients on.
template <typename Function>
int64_t SavedBytesOf(const torch::Tensor& out) {
  const auto node = std::dynamic_pointer_cast<torch::autograd::CppNode<Function>>(out.grad_fn());
  if (!node) return 0;
  int64_t bytes = 0;
  for (const auto& t : node->ctx_.get_saved_variables()) bytes += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  return bytes;
}

}  // namespace darkformer::causal_ops
