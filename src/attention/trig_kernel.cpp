// Trigonometric random-feature attention (see trig_kernel.h).
#include "attention/trig_kernel.h"

#include <cmath>

#include "attention/causal_linear_attention.h"
#include "attention/positive_features.h"

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

struct TrigState : DecodeState {
  torch::Tensor s_BHMV, ref_BH;  // sum_j exp(b_j - ref) psi_j [v_j, 1]^T and its reference
  int64_t Bytes() const override { return NbytesOrZero(s_BHMV) + NbytesOrZero(ref_BH); }
};

}  // namespace

torch::Tensor TrigKernelImpl::forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD,
                                      const torch::Tensor& v_BKLD, const AttentionCall& call) {
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
  if (!state) state = std::make_unique<TrigState>();
  auto& s = dynamic_cast<TrigState&>(*state);
  const auto dtype = FeatureDtype(q_BHTD.scalar_type());
  const double root = std::sqrt(call.scale);
  const int64_t heads = q_BHTD.size(1), new_tokens = q_BHTD.size(2);
  const auto q_feat_BHTM = SignedFeatures(q_BHTD.to(dtype) * root);
  const auto keys = KeysOf(*this, RepeatKvHeads(k_BKTD, heads).to(dtype) * root);
  const auto v_BHTD = RepeatKvHeads(v_BKTD, heads).to(dtype);
  const auto vh_BHTV = torch::cat({v_BHTD, torch::ones_like(v_BHTD.narrow(-1, 0, 1))}, -1);
  std::vector<torch::Tensor> outs;
  for (int64_t t = 0; t < new_tokens; ++t) {
    // Fold key t at the new running max (the state rescaled down when it grows), then read.
    const auto b_BH = keys.log_scale_BNL.select(2, t);
    const auto ref_BH = s.ref_BH.defined() ? torch::maximum(s.ref_BH, b_BH) : b_BH;
    const auto add_BHMV = torch::matmul((keys.features_BNLM.select(2, t) * (b_BH - ref_BH).exp().unsqueeze(-1)).unsqueeze(-1),
                                        vh_BHTV.select(2, t).unsqueeze(-2));
    s.s_BHMV = s.s_BHMV.defined() ? s.s_BHMV * (s.ref_BH - ref_BH).exp().unsqueeze(-1).unsqueeze(-1) + add_BHMV : add_BHMV;
    s.ref_BH = ref_BH;
    const auto n_BHV = torch::matmul(q_feat_BHTM.select(2, t).unsqueeze(-2), s.s_BHMV).squeeze(-2);
    const auto den_BH = n_BHV.select(-1, v_BHTD.size(-1));
    const auto safe_BH = torch::where(den_BH >= 0, den_BH.clamp_min(normaliser_floor_), den_BH.clamp_max(-normaliser_floor_));
    outs.push_back((n_BHV.narrow(-1, 0, v_BHTD.size(-1)) / safe_BH.unsqueeze(-1)).unsqueeze(2));
  }
  s.tokens += new_tokens;
  return torch::cat(outs, 2).to(v_BKTD.scalar_type());
}

}  // namespace darkformer
