// LFK, the learnable-feature kernel (000 sec. 6): the Performer feature map
// phi(x) = exp(Wx - |x|^2/2) / sqrt(m) with W a trainable parameter initialised by a Performer draw.
#pragma once

#include "attention/log_feature_kernel.h"

namespace darkformer {

class LfkKernelImpl : public LogFeatureKernel {
 public:
  struct Options {
    FeatureKernelOptions features;  // no redraw: W trains
    static Options Read(const ConfigReader& reader);  // and refuses unknown keys
  };
  LfkKernelImpl(const KernelShape& shape, const Options& options);
  torch::Tensor LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                bool is_query) const override;
  std::vector<torch::Tensor> FeatureParams() const override;
  // log phi = LogPositiveFeatures(x, W) with W trainable: the closed-form backward gives dW.
  std::optional<PositiveFeatureForm> PositiveForm() const override { return PositiveFeatureForm{{}, W}; }
  // exp(x.y) at initialisation (a Performer draw); a trained W estimates no fixed kernel.
  torch::Tensor EstimatorTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const override {
    return SoftmaxKernelTarget(x_BHPD, y_BHPD);
  }

  torch::Tensor W;  // m x d, trainable
};
TORCH_MODULE(LfkKernel);

}  // namespace darkformer
