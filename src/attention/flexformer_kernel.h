// Flexformer (004 sec. 3): exp(x.y) = exp(|x|^2/2) exp(-|x - y|^2/2) exp(|y|^2/2) in our scaled
// notation; the Gaussian factor is approximated by Fourier features with trainable frequencies
// and the norm factor's divisor 2 becomes a learnable exp(tau) (per head):
//   phi(x) = exp(|x|^2 / exp(tau)) f(x),
//   stationary:    f(x) = [cos Omega x, sin Omega x] / sqrt(n)                    (004 eq. 5)
//   nonstationary: f(x) = [cos W1'x * cos W2'x, sin W1'x * cos W2'x] / sqrt(n),    (004 eq. 6)
//                  W1' = (W1 + W2)/2, W2' = (W1 - W2)/2 from trainable pairs (W1, W2).
// Initialised from one draw W ~ N(0, I) (both W1 and W2 = W) and tau = log 2, which is the
// trigonometric estimator of exp(x.y) (trig_kernel.h). Features are signed: composite path, the
// query factor dropped (it cancels), the key factor as the stabiliser's log-scale, the normaliser
// floored with its sign kept. Frequencies and tau are per head (004 App. B).
#pragma once

#include "attention/feature_kernel_base.h"

namespace darkformer {

class FlexformerKernelImpl : public FeatureKernelBase {
 public:
  FlexformerKernelImpl(const KernelShape& shape, const ConfigReader& options);
  std::string kernel_name() const override { return "flexformer"; }
  torch::Tensor forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD,
                        const AttentionCall& call) override;
  torch::Tensor Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD, const torch::Tensor& k_BKTD,
                       const torch::Tensor& v_BKTD, const AttentionCall& call) override;
  // f(x) for x_BHLD (H = the kernel's heads): BHL(2n).
  torch::Tensor FourierFeatures(const torch::Tensor& x_BHLD) const;
  // |x|^2 / exp(tau) per position: BHL.
  torch::Tensor LogScale(const torch::Tensor& x_BHLD) const;
  torch::Tensor LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                bool is_query) const override;
  std::vector<torch::Tensor> FeatureParams() const override { return {frequencies, tau}; }
  double MaxLogFeature(const torch::Tensor& x_BHLD) const override;
  bool nonstationary() const { return nonstationary_; }

  torch::Tensor frequencies;  // H x n x d (stationary) or H x 2 x n x d (nonstationary), trainable
  torch::Tensor tau;          // H, trainable

 private:
  bool nonstationary_ = false;
  double normaliser_floor_ = 1e-6;
};
TORCH_MODULE(FlexformerKernel);

}  // namespace darkformer
