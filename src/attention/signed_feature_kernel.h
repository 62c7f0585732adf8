// Signed feature maps (trig, slay, flexformer): phi(x) = exp(c(x)) f(x) with f(x) signed, so
// there is no log phi and no fused operator. A kernel gives f (SignedFeatures) and c (LogScale,
// or none); this base runs the composite path (causal_linear_attention.h) and decodes
// (signed_feature_decoding.h):
// - the query factor exp(c(x_i)) multiplies numerator and denominator alike and is dropped;
// - the key factor exp(c(y_j)) is the stabiliser's log-scale (reference = running max: nothing
//   overflows and position t reads no later key), the features carrying its gradient;
// - sum_j phi(x_i).phi(y_j) can be zero or negative: its magnitude is floored at
//   `normaliser_floor` with its sign kept, so outputs stay finite (large where the estimate of
//   sum_j k(x_i, y_j) is near zero, as the estimator is).
#pragma once

#include "attention/feature_kernel_base.h"

namespace darkformer {

class SignedFeatureKernel : public FeatureKernelBase {
 public:
  torch::Tensor forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD,
                        const AttentionCall& call) override;
  torch::Tensor Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD, const torch::Tensor& k_BKTD,
                       const torch::Tensor& v_BKTD, const AttentionCall& call) override;

  // f(x) for a query or key block x_BNLD (N = the kernel's heads): BNLM in the feature dtype.
  virtual torch::Tensor SignedFeatures(const torch::Tensor& x_BNLD) const = 0;
  // c(x), the log of phi's positive factor: BNL, or undefined when phi = f.
  virtual torch::Tensor LogScale(const torch::Tensor& /*x_BNLD*/) const { return {}; }
  // exp(c(x) + c(y)) f(x).f(y).
  torch::Tensor PairEstimate(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const override;
  double normaliser_floor() const { return normaliser_floor_; }
  // What the maps see: x = sqrt(s) q (or q itself, ScalesInputs) in `dtype`.
  torch::Tensor Inputs(const torch::Tensor& q_BNLD, torch::ScalarType dtype, const AttentionCall& call) const;

 protected:
  // The shared options (no `op`: there is no fused path) and normaliser_floor; the kernel reads
  // its own after them and refuses unknown keys.
  struct SignedOptions {
    FeatureKernelOptions features;
    double normaliser_floor = 1e-6;
    static SignedOptions Read(const ConfigReader& reader, bool with_redraw,
                              int64_t default_features = FeatureKernelOptions::kDefaultFeatures);
  };
  SignedFeatureKernel(const KernelShape& shape, const SignedOptions& options);
  // Whether the maps see x = sqrt(s) q (the default) or q itself (slay: a kernel of directions).
  virtual bool ScalesInputs() const { return true; }

 private:
  struct KeyBlock {
    torch::Tensor features_BNLM, log_scale_BNL;  // log_scale undefined: none
  };
  // Key side: f(y) exp(c - sg(c)) (value f(y), gradient of exp(c)) and log-scale sg(c).
  KeyBlock Keys(const torch::Tensor& y_BNLD) const;

  double normaliser_floor_;
};

}  // namespace darkformer
