// Trigonometric random features (001; RFA): phi(x) = exp(|x|^2/2)/sqrt(m) [sin Wx, cos Wx],
// W rows ~ N(0, I): E[phi(x).phi(y)] = exp(|x|^2/2 + |y|^2/2) E[cos w.(x - y)] = exp(x.y), but the
// features are signed, so the normaliser sum_j phi(x_i).phi(y_j) can be zero or negative.
// - The query factor exp(|x_i|^2/2) multiplies numerator and denominator alike and is dropped
//   (exactly); the key factor exp(|y_j|^2/2) is the key's log-scale in the causal-safe stabiliser
//   (reference = running max), so nothing overflows and position t reads no later key.
// - The normaliser's magnitude is floored at `normaliser_floor` (sign kept): an output then stays
//   finite (no NaN) where the estimate of sum_j exp(x_i.y_j) is near zero; it is large there, as
//   the estimator is. Positive-feature kernels (performer, gerf) avoid this by construction.
// Signed features have no log form, so trig runs the composite path (causal_linear_attention.h),
// not the fused operator (`fused` has no effect), and decodes with its own running sums.
#pragma once

#include "attention/feature_kernel_base.h"

namespace darkformer {

class TrigKernelImpl : public FeatureKernelBase {
 public:
  TrigKernelImpl(const KernelShape& shape, const ConfigReader& options);
  std::string kernel_name() const override { return "trig"; }
  torch::Tensor forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD,
                        const AttentionCall& call) override;
  torch::Tensor Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD, const torch::Tensor& k_BKTD,
                       const torch::Tensor& v_BKTD, const AttentionCall& call) override;
  // [sin Wx, cos Wx] / sqrt(m) (without the exp(|x|^2/2) factor) for x_BNLD: BNL(2m).
  torch::Tensor SignedFeatures(const torch::Tensor& x_BNLD) const;
  // Signed features have no logarithm: the fused operator's interface is not available.
  torch::Tensor LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                bool is_query) const override;
  std::vector<torch::Tensor> FeatureParams() const override { return {projection_}; }
  // The largest log-scale |x|^2 / 2 (what can overflow), for spike diagnostics.
  double MaxLogFeature(const torch::Tensor& x_BHLD) const override;
  double normaliser_floor() const { return normaliser_floor_; }

 private:
  double normaliser_floor_ = 1e-6;
};
TORCH_MODULE(TrigKernel);

}  // namespace darkformer
