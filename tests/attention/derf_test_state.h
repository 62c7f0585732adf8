// Test helper: puts an aderf / sderf kernel in a random state of its own form, as a calibration
// could leave it (002 Thm 4.1's conditions hold): aderf a scalar a < 1/8 and P_query = Q e^{sG} Q^T
// (symmetric positive, the form of Thm 4.2's geometric-mean P up to a rotation), P_key =
// P_query^-T; sderf one orthogonal P for both sides and a_l < 1/8 per coordinate. Tests then see
// the kernel itself, not Performer.
#pragma once

#include <torch/torch.h>

#include <cmath>

#include "attention/derf_kernel.h"

namespace darkformer {

// Returns whether `kernel` is a DERF kernel (and was perturbed); `scale` spreads log P's eigenvalues
// at random, or, with `condition` > 0, evenly so that aderf's P has that condition number.
inline bool PerturbDerf(AttentionKernelImpl& kernel, double scale, uint64_t seed = 13, double condition = 0.0) {
  auto* derf = dynamic_cast<DerfKernelImpl*>(&kernel);
  if (!derf) return false;
  torch::NoGradGuard no_grad;
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto buffers = derf->named_buffers();
  const int64_t d = buffers["a"].size(0);
  const auto rotation = std::get<0>(torch::linalg_qr(torch::randn({d, d}, g, torch::kFloat64)));
  if (derf->kernel_name() == "sderf") {
    buffers["a"].copy_(torch::rand({d}, g, torch::kFloat64) * 0.3 - 0.25);
    buffers["p_query"].copy_(rotation);
    buffers["p_key"].copy_(rotation);
  } else {
    const auto log_scales = condition > 0 ? torch::linspace(-0.5, 0.5, d, torch::kFloat64) * std::log(condition)
                                          : scale * torch::randn({d}, g, torch::kFloat64);
    buffers["a"].fill_(torch::rand({1}, g, torch::kFloat64).item<double>() * 0.3 - 0.25);
    buffers["p_query"].copy_(torch::matmul(rotation * log_scales.exp(), rotation.t()));
    buffers["p_key"].copy_(torch::matmul(rotation * (-log_scales).exp(), rotation.t()));
  }
  return true;
}

}  // namespace darkformer
