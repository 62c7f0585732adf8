// Signed feature maps and their shared composite path (see signed_feature_kernel.h).
#include "attention/signed_feature_kernel.h"

#include <cmath>

#include "attention/causal_linear_attention.h"
#include "attention/positive_features.h"
#include "attention/signed_feature_decoding.h"
#include "util/mixed_precision.h"

namespace darkformer {

SignedFeatureKernel::SignedOptions SignedFeatureKernel::SignedOptions::Read(const ConfigReader& reader, bool with_redraw,
                                                                           int64_t default_features) {
  SignedOptions o{FeatureKernelOptions::Read(reader, with_redraw, /*with_op=*/false, default_features)};
  o.normaliser_floor = reader.Get<double>(
      "normaliser_floor", o.normaliser_floor,
      KeySpec("the normaliser's magnitude is floored here (sign kept): finite where it crosses zero").Above(0));
  return o;
}

SignedFeatureKernel::SignedFeatureKernel(const KernelShape& shape, const SignedOptions& options)
    : FeatureKernelBase(shape, options.features), normaliser_floor_(options.normaliser_floor) {}

torch::Tensor SignedFeatureKernel::Inputs(const torch::Tensor& q_BNLD, torch::ScalarType dtype,
                                          const AttentionCall& call) const {
  const auto x_BNLD = q_BNLD.to(dtype);
  return ScalesInputs() ? x_BNLD * std::sqrt(call.scale) : x_BNLD;
}

SignedFeatureKernel::KeyBlock SignedFeatureKernel::Keys(const torch::Tensor& y_BNLD) const {
  const auto c_BNL = LogScale(y_BNLD);
  if (!c_BNL.defined()) return {SignedFeatures(y_BNLD), torch::Tensor()};
  const auto b_BNL = c_BNL.detach();
  return {SignedFeatures(y_BNLD) * (c_BNL - b_BNL).exp().unsqueeze(-1), b_BNL};
}

torch::Tensor SignedFeatureKernel::forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD,
                                           const torch::Tensor& v_BKLD, const AttentionCall& call) {
  NoAutocastGuard fp32;  // computes in fp32 even when called inside autocast
  const auto dtype = FeatureDtype(q_BHLD.scalar_type());
  const int64_t heads = q_BHLD.size(1);
  const auto keys = Keys(Inputs(RepeatKvHeads(k_BKLD, heads), dtype, call));
  const auto out_BHLD = LinearAttention(SignedFeatures(Inputs(q_BHLD, dtype, call)), keys.features_BNLM,
                                        keys.log_scale_BNL, RepeatKvHeads(v_BKLD, heads), call.causal,
                                        options_.chunk_size, normaliser_floor_);
  return out_BHLD.to(v_BKLD.scalar_type());
}

torch::Tensor SignedFeatureKernel::Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD,
                                          const torch::Tensor& k_BKTD, const torch::Tensor& v_BKTD,
                                          const AttentionCall& call) {
  NoAutocastGuard fp32;  // computes in fp32 even when called inside autocast
  const auto dtype = FeatureDtype(q_BHTD.scalar_type());
  const int64_t heads = q_BHTD.size(1);
  const auto keys = Keys(Inputs(RepeatKvHeads(k_BKTD, heads), dtype, call));
  return SignedFeatureDecode(state, SignedFeatures(Inputs(q_BHTD, dtype, call)), keys.features_BNLM,
                             keys.log_scale_BNL, RepeatKvHeads(v_BKTD, heads), normaliser_floor_)
      .to(v_BKTD.scalar_type());
}

torch::Tensor SignedFeatureKernel::PairEstimate(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const {
  const auto dot_BHP = (SignedFeatures(x_BHPD) * SignedFeatures(y_BHPD)).sum(-1);
  const auto cx_BHP = LogScale(x_BHPD), cy_BHP = LogScale(y_BHPD);
  return cx_BHP.defined() ? (cx_BHP + cy_BHP).exp() * dot_BHP : dot_BHP;
}

}  // namespace darkformer
