// LFK, the learnable-feature kernel (000 sec. 6): the Performer feature map
// phi(x) = exp(Wx - |x|^2/2) / sqrt(m) with W a trainable parameter initialised by a Performer draw.
#pragma once

#include "attention/feature_kernel_base.h"

namespace darkformer {

class LfkKernelImpl : public FeatureKernelBase {
 public:
  LfkKernelImpl(const KernelShape& shape, const ConfigReader& options);
  std::string kernel_name() const override { return "lfk"; }
  torch::Tensor LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                bool is_query) const override;
  std::vector<torch::Tensor> FeatureParams() const override;
  // log phi = LogPositiveFeatures(x, W) with W trainable: the closed-form backward gives dW.
  std::optional<PositiveFeatureForm> PositiveForm() const override { return PositiveFeatureForm{{}, W}; }

  torch::Tensor W;  // m x d, trainable
};
TORCH_MODULE(LfkKernel);

}  // namespace darkformer
