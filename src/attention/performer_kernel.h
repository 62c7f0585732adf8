// Performer / FAVOR+ attention (000 eq. 1, Lemma 2.1): phi(x) = exp(Wx - |x|^2/2) / sqrt(m) with a
// drawn W (orthogonal blocks with chi(d) row norms, or iid rows), redrawn by policy.
#pragma once

#include "attention/log_feature_kernel.h"

namespace darkformer {

class PerformerKernelImpl : public LogFeatureKernel {
 public:
  struct Options {
    FeatureKernelOptions features;
    static Options Read(const ConfigReader& reader);  // and refuses unknown keys
  };
  PerformerKernelImpl(const KernelShape& shape, const Options& options);
  torch::Tensor LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                bool is_query) const override;
  std::vector<torch::Tensor> FeatureParams() const override;
  // log phi = LogPositiveFeatures(x, W): the fused operator's closed-form backward applies.
  std::optional<PositiveFeatureForm> PositiveForm() const override { return PositiveFeatureForm{{}, projection_}; }
  // exp(x.y) (000 Lemma 2.1).
  torch::Tensor EstimatorTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const override {
    return SoftmaxKernelTarget(x_BHPD, y_BHPD);
  }
};
TORCH_MODULE(PerformerKernel);

}  // namespace darkformer
