// Flexformer attention (see flexformer_kernel.h).
#include "attention/flexformer_kernel.h"

#include "util/mixed_precision.h"

#include <cmath>

#include "attention/causal_linear_attention.h"
#include "attention/positive_features.h"
#include "attention/signed_feature_decoding.h"

namespace darkformer {

FlexformerKernelImpl::FlexformerKernelImpl(const KernelShape& shape, const ConfigReader& options)
    : FeatureKernelBase(shape, FeatureKernelOptions::Read(options, /*with_redraw=*/false)) {
  const auto variant = options.Get<std::string>("variant", "stationary");
  DF_CHECK(variant == "stationary" || variant == "nonstationary",
           "config key '" << options.KeyPath("variant") << "' must be stationary or nonstationary, got '" << variant << "'");
  nonstationary_ = variant == "nonstationary";
  normaliser_floor_ = options.Get<double>("normaliser_floor", normaliser_floor_);
  DF_CHECK(normaliser_floor_ > 0, "config key '" << options.KeyPath("normaliser_floor") << "' must be positive");
  options.RejectUnknown();
  // One draw (the layer's seed), the same for every head and for both members of a pair: at
  // initialisation the kernel is the trigonometric estimator of exp(x.y).
  const auto w_MD = DrawProjection(options_.projection, options_.num_features, shape.head_dim,
                                   DrawSeed(KernelSeed(options_.seed, shape), 0));
  auto init = w_MD.unsqueeze(0).repeat({shape.num_heads, 1, 1});
  if (nonstationary_) init = init.unsqueeze(1).repeat({1, 2, 1, 1});
  frequencies = register_parameter("frequencies", init.contiguous());
  tau = register_parameter("tau", torch::full({shape.num_heads}, std::log(2.0), torch::kFloat32));
}

torch::Tensor FlexformerKernelImpl::FourierFeatures(const torch::Tensor& x_BHLD) const {
  const auto x = x_BHLD.to(FeatureDtype(x_BHLD.scalar_type()));
  const auto w = frequencies.to(x.scalar_type());
  const double n = static_cast<double>(w.size(-2));
  if (!nonstationary_) {
    const auto proj_BHLN = torch::matmul(x, w.transpose(-1, -2).unsqueeze(0));
    return torch::cat({proj_BHLN.cos(), proj_BHLN.sin()}, -1) / std::sqrt(n);
  }
  // 004 eq. 6: W1' = (W1 + W2)/2, W2' = (W1 - W2)/2.
  const auto w1 = 0.5 * (w.select(1, 0) + w.select(1, 1)), w2 = 0.5 * (w.select(1, 0) - w.select(1, 1));
  const auto p1_BHLN = torch::matmul(x, w1.transpose(-1, -2).unsqueeze(0));
  const auto c2_BHLN = torch::matmul(x, w2.transpose(-1, -2).unsqueeze(0)).cos();
  return torch::cat({p1_BHLN.cos() * c2_BHLN, p1_BHLN.sin() * c2_BHLN}, -1) / std::sqrt(n);
}

torch::Tensor FlexformerKernelImpl::LogScale(const torch::Tensor& x_BHLD) const {
  const auto x = x_BHLD.to(FeatureDtype(x_BHLD.scalar_type()));
  return x.pow(2).sum(-1) / tau.to(x.scalar_type()).exp().view({1, -1, 1});
}

torch::Tensor FlexformerKernelImpl::LogFeaturesWith(const torch::Tensor&, const std::vector<torch::Tensor>&, bool) const {
  Fail("attention kernel 'flexformer' has signed Fourier features: they have no log form (it runs the composite path)");
}

double FlexformerKernelImpl::MaxLogFeature(const torch::Tensor& x_BHLD) const { return LogScale(x_BHLD).max().item<double>(); }

namespace {

// Key side: Fourier features carrying the gradient of exp(c - b), c = |y|^2 / exp(tau), b = c detached.
std::pair<torch::Tensor, torch::Tensor> KeySide(const FlexformerKernelImpl& kernel, const torch::Tensor& y_BHLD) {
  const auto c_BHL = kernel.LogScale(y_BHLD);
  const auto b_BHL = c_BHL.detach();
  return {kernel.FourierFeatures(y_BHLD) * (c_BHL - b_BHL).exp().unsqueeze(-1), b_BHL};
}

}  // namespace

torch::Tensor FlexformerKernelImpl::forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD,
                                            const torch::Tensor& v_BKLD, const AttentionCall& call) {
  NoAutocastGuard fp32;  // computes in fp32 even when called inside autocast
  const auto dtype = FeatureDtype(q_BHLD.scalar_type());
  const double root = std::sqrt(call.scale);
  const int64_t heads = q_BHLD.size(1);
  const auto [k_features, k_log_scale] = KeySide(*this, RepeatKvHeads(k_BKLD, heads).to(dtype) * root);
  const auto out_BHLD = LinearAttention(FourierFeatures(q_BHLD.to(dtype) * root), k_features, k_log_scale,
                                        RepeatKvHeads(v_BKLD, heads), call.causal, options_.chunk_size,
                                        normaliser_floor_);
  return out_BHLD.to(v_BKLD.scalar_type());
}

torch::Tensor FlexformerKernelImpl::Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD,
                                           const torch::Tensor& k_BKTD, const torch::Tensor& v_BKTD,
                                           const AttentionCall& call) {
  NoAutocastGuard fp32;  // computes in fp32 even when called inside autocast
  const auto dtype = FeatureDtype(q_BHTD.scalar_type());
  const double root = std::sqrt(call.scale);
  const int64_t heads = q_BHTD.size(1);
  const auto [k_features, k_log_scale] = KeySide(*this, RepeatKvHeads(k_BKTD, heads).to(dtype) * root);
  return SignedFeatureDecode(state, FourierFeatures(q_BHTD.to(dtype) * root), k_features, k_log_scale,
                             RepeatKvHeads(v_BKTD, heads), normaliser_floor_)
      .to(v_BKTD.scalar_type());
}

}  // namespace darkformer
