// Flexformer (004 sec. 3): exp(x.y) = exp(|x|^2/2) exp(-|x - y|^2/2) exp(|y|^2/2) in our scaled
// notation; the Gaussian factor is approximated by Fourier features with trainable frequencies
// and the norm factor's divisor 2 becomes a learnable exp(tau) (per head):
//   phi(x) = exp(|x|^2 / exp(tau)) f(x),
//   stationary:    f(x) = [cos Omega x, sin Omega x] / sqrt(n)                    (004 eq. 5)
//   nonstationary: f(x) = [cos W1'x * cos W2'x, sin W1'x * cos W2'x] / sqrt(n),    (004 eq. 6)
//                  W1' = (W1 + W2)/2, W2' = (W1 - W2)/2 from trainable pairs (W1, W2).
// Initialised from one draw W ~ N(0, I) (both W1 and W2 = W) and tau = log 2, which is the
// trigonometric estimator of exp(x.y) (trig_kernel.h). Features are signed, log-scale
// |x|^2 / exp(tau) (signed_feature_kernel.h). Frequencies and tau are per head (004 App. B).
#pragma once

#include "attention/signed_feature_kernel.h"

namespace darkformer {

class FlexformerKernelImpl : public SignedFeatureKernel {
 public:
  struct Options : SignedOptions {
    bool nonstationary = false;
    static Options Read(const ConfigReader& reader);  // and refuses unknown keys
  };
  FlexformerKernelImpl(const KernelShape& shape, const Options& options);
  // f(x) for x_BHLD (H = the kernel's heads): BHL(2n).
  torch::Tensor FourierFeatures(const torch::Tensor& x_BHLD) const;
  torch::Tensor SignedFeatures(const torch::Tensor& x_BHLD) const override { return FourierFeatures(x_BHLD); }
  // |x|^2 / exp(tau) per position: BHL.
  torch::Tensor LogScale(const torch::Tensor& x_BHLD) const override;
  // exp(x.y): at initialisation the map is trig's estimator (above); trained frequencies and tau
  // move it away.
  torch::Tensor EstimatorTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const override {
    return SoftmaxKernelTarget(x_BHPD, y_BHPD);
  }
  double MaxLogFeature(const torch::Tensor& x_BHLD) const override;
  bool nonstationary() const { return nonstationary_; }

  torch::Tensor frequencies;  // H x n x d (stationary) or H x 2 x n x d (nonstationary), trainable
  torch::Tensor tau;          // H, trainable

 private:
  bool nonstationary_;
};
TORCH_MODULE(FlexformerKernel);

}  // namespace darkformer
