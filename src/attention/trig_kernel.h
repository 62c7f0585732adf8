// Trigonometric random features (001; RFA): phi(x) = exp(|x|^2/2)/sqrt(m) [sin Wx, cos Wx],
// W rows ~ N(0, I): E[phi(x).phi(y)] = exp(|x|^2/2 + |y|^2/2) E[cos w.(x - y)] = exp(x.y). The
// features are signed, so the normaliser sum_j phi(x_i).phi(y_j) can be zero or negative:
// signed_feature_kernel.h runs them (composite path, normaliser floored with its sign kept).
// Positive-feature kernels (performer, gerf) avoid this by construction.
#pragma once

#include "attention/signed_feature_kernel.h"

namespace darkformer {

class TrigKernelImpl : public SignedFeatureKernel {
 public:
  struct Options : SignedOptions {
    static Options Read(const ConfigReader& reader);  // and refuses unknown keys
  };
  TrigKernelImpl(const KernelShape& shape, const Options& options);
  // f(x) = [sin Wx, cos Wx] / sqrt(m) for x_BNLD: BNL(2m).
  torch::Tensor SignedFeatures(const torch::Tensor& x_BNLD) const override;
  // c(x) = |x|^2 / 2.
  torch::Tensor LogScale(const torch::Tensor& x_BNLD) const override;
  // exp(x.y) (derived above).
  torch::Tensor EstimatorTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const override {
    return SoftmaxKernelTarget(x_BHPD, y_BHPD);
  }
  // The largest log-scale |x|^2 / 2 (what can overflow), for spike diagnostics.
  double MaxLogFeature(const torch::Tensor& x_BHLD) const override;
};
TORCH_MODULE(TrigKernel);

}  // namespace darkformer
