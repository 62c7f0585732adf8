// Central differences in fp64 against autograd, for the kernels' gradient tests.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace darkformer::testing {

// Worst |numeric - analytic| / max(1, |analytic|) over every element of each tensor in `inputs`
// (leaf tensors in fp64 that loss_fn reads), eps = 1e-6.
inline double MaxGradientError(const std::function<torch::Tensor()>& loss_fn, const std::vector<torch::Tensor>& inputs) {
  for (auto x : inputs) x.mutable_grad() = torch::Tensor();
  loss_fn().backward();
  double worst = 0.0;
  const double eps = 1e-6;
  torch::NoGradGuard no_grad;
  for (const auto& x : inputs) {
    const auto analytic = x.grad().clone();
    auto flat = x.view({-1});
    for (int64_t i = 0; i < flat.size(0); ++i) {
      const double saved = flat[i].item<double>();
      flat[i].fill_(saved + eps);
      const double up = loss_fn().item<double>();
      flat[i].fill_(saved - eps);
      const double down = loss_fn().item<double>();
      flat[i].fill_(saved);
      const double a = analytic.view({-1})[i].item<double>();
      worst = std::max(worst, std::abs((up - down) / (2 * eps) - a) / std::max(1.0, std::abs(a)));
    }
  }
  return worst;
}

}  // namespace darkformer::testing
