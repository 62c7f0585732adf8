// Trigonometric random-feature attention (see trig_kernel.h).
#include "attention/trig_kernel.h"

#include "util/mixed_precision.h"

#include <cmath>

#include "attention/causal_linear_attention.h"
#include "attention/positive_features.h"
#include "attention/signed_feature_decoding.h"

namespace darkformer {

TrigKernelImpl::TrigKernelImpl(const KernelShape& shape, const ConfigReader& options)
    : FeatureKernelBase(shape, FeatureKernelOptions::Read(options, /*with_redraw=*/true)) {
  normaliser_floor_ = options.Get<double>("normaliser_floor", normaliser_floor_);
  DF_CHECK(normaliser_floor_ > 0, "config key '" << options.KeyPath("normaliser_floor") << "' must be positive, got "
                                                 << normaliser_floor_);
  options.RejectUnknown();
  RegisterDraw(shape.head_dim);
}

torch::Tensor TrigKernelImpl::SignedFeatures(const torch::Tensor& x_BNLD) const {
  const auto x = x_BNLD.to(FeatureDtype(x_BNLD.scalar_type()));
  const auto proj_BNLM = torch::matmul(x, projection_.to(x.device(), x.scalar_type()).t());
  const double m = static_cast<double>(projection_.size(0));
  return torch::cat({proj_BNLM.sin(), proj_BNLM.cos()}, -1) / std::sqrt(m);
}

torch::Tensor TrigKernelImpl::LogFeaturesWith(const torch::Tensor&, const std::vector<torch::Tensor>&, bool) const {
  Fail("attention kernel 'trig' has signed features: they have no log form (it runs the composite path)");
}

double TrigKernelImpl::MaxLogFeature(const torch::Tensor& x_BHLD) const {
  return (0.5 * x_BHLD.to(torch::kFloat32).pow(2).sum(-1)).max().item<double>();
}

namespace {

// Key side: signed features carrying the gradient of exp(|y|^2/2 - b), b = |y|^2/2 detached (the
// stabiliser's log-scale: its value is the factor, the features' value is unchanged).
struct TrigKeys {
  torch::Tensor features_BNLM, log_scale_BNL;
};
TrigKeys KeysOf(const TrigKernelImpl& kernel, const torch::Tensor& y_BNLD) {
  const auto half_sq_BNL = 0.5 * y_BNLD.pow(2).sum(-1);
  const auto b_BNL = half_sq_BNL.detach();
  return {kernel.SignedFeatures(y_BNLD) * (half_sq_BNL - b_BNL).exp().unsqueeze(-1), b_BNL};
}

}  // namespace

torch::Tensor TrigKernelImpl::forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD,
                                      const torch::Tensor& v_BKLD, const AttentionCall& call) {
  NoAutocastGuard fp32;  // computes in fp32 even when called inside autocast
  const auto dtype = FeatureDtype(q_BHLD.scalar_type());
  const double root = std::sqrt(call.scale);
  const int64_t heads = q_BHLD.size(1);
  const auto x_BHLD = q_BHLD.to(dtype) * root;
  const auto y_BHLD = RepeatKvHeads(k_BKLD, heads).to(dtype) * root;
  const auto keys = KeysOf(*this, y_BHLD);
  const auto out_BHLD = LinearAttention(SignedFeatures(x_BHLD), keys.features_BNLM, keys.log_scale_BNL,
                                        RepeatKvHeads(v_BKLD, heads), call.causal, options_.chunk_size,
                                        normaliser_floor_);
  return out_BHLD.to(v_BKLD.scalar_type());
}

torch::Tensor TrigKernelImpl::Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD,
                                     const torch::Tensor& k_BKTD, const torch::Tensor& v_BKTD, const AttentionCall& call) {
  NoAutocastGuard fp32;  // computes in fp32 even when called inside autocast
  const auto dtype = FeatureDtype(q_BHTD.scalar_type());
  const double root = std::sqrt(call.scale);
  const int64_t heads = q_BHTD.size(1);
  const auto keys = KeysOf(*this, RepeatKvHeads(k_BKTD, heads).to(dtype) * root);
  return SignedFeatureDecode(state, SignedFeatures(q_BHTD.to(dtype) * root), keys.features_BNLM, keys.log_scale_BNL,
                             RepeatKvHeads(v_BKTD, heads), normaliser_floor_)
      .to(v_BKTD.scalar_type());
}

}  // namespace darkformer
