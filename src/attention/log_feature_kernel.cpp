// Positive feature maps in log form and their shared forward pass (see log_feature_kernel.h).
#include "attention/log_feature_kernel.h"

#include <cmath>

#include "attention/ops/per_feature_attention.h"
#include "attention/positive_features.h"
#include "util/error.h"
#include "util/mixed_precision.h"

namespace darkformer {

FeatureMap LogFeatureKernel::MakeFeatureMap() const {
  FeatureMap map;
  // The kernel module outlives any graph built from it (it owns the parameters the graph reads).
  map.log_features = [this](const torch::Tensor& x, const std::vector<torch::Tensor>& params, bool is_query) {
    return LogFeaturesWith(x, params, is_query);
  };
  map.params = FeatureParams();
  map.keys_per_query_head = KeysPerQueryHead();
  map.params_per_head = FeatureParamsPerHead();
  map.op = options_.op;
  map.sub_chunk = options_.sub_chunk;
  map.segment_chunks = options_.segment_chunks;
  map.exponential_pairs = options_.exponential_pairs;
  map.precompute_features = options_.precompute_features;
  map.num_features = options_.num_features;
  return map;
}

torch::Tensor LogFeatureKernel::forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD,
                                         const torch::Tensor& v_BKLD, const AttentionCall& call) {
  NoAutocastGuard fp32;  // features, M q, running sums: fp32 even when called inside autocast
  const auto dtype = FeatureDtype(q_BHLD.scalar_type());
  const double root_scale = std::sqrt(call.scale);
  const bool fused = options_.op != CausalOp::kNaive;
  if (call.causal && fused) {
    if (const auto form = PositiveForm()) {
      return ForwardPositiveFused(*form, q_BHLD, k_BKLD, v_BKLD, root_scale, call.document_ids_BL);
    }
  }
  const auto x_BHLD = q_BHLD.to(dtype) * root_scale;
  if (call.causal && fused) {
    // One operator, key features once per KV head (fused_causal_attention.h).
    const auto y_BKLD = k_BKLD.to(dtype) * root_scale;
    auto map = MakeFeatureMap();
    map.input_dtype = q_BHLD.scalar_type();
    const auto out_BHLD = FusedCausalLinearAttention(x_BHLD, y_BKLD, v_BKLD.to(dtype), map, options_.chunk_size,
                                                     call.document_ids_BL);
    return out_BHLD.to(v_BKLD.scalar_type());
  }
  // The naive composite path (the reference the fused operator is tested against).
  DF_CHECK(!call.document_ids_BL.defined(), kernel_name() << ": the composite path takes one document per call (Attend)");
  const int64_t heads = q_BHLD.size(1);
  // Converted before the repeat: the gradients of a KV head's copies then add up in fp32, not bf16.
  const auto y_BHLD = RepeatKvHeads(k_BKLD.to(dtype), heads) * root_scale;
  const auto v_BHLD = RepeatKvHeads(v_BKLD.to(dtype), heads);
  // Log-features in, the per-feature stabiliser inside (per_feature_attention.h): the normaliser
  // is at least 1 at any scale.
  const auto out_BHLD = PerFeatureLinearAttention(LogFeatures(x_BHLD, /*is_query=*/true),
                                                  LogFeatures(y_BHLD, /*is_query=*/false), v_BHLD,
                                                  call.causal, options_.chunk_size);
  return out_BHLD.to(v_BKLD.scalar_type());
}

torch::Tensor LogFeatureKernel::ForwardPositiveFused(const PositiveFeatureForm& form, const torch::Tensor& q_BHLD,
                                                      const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD,
                                                      double root_scale, const torch::Tensor& document_ids_BL) const {
  FeatureMap map;
  map.log_features = [](const torch::Tensor& in, const std::vector<torch::Tensor>& params, bool /*is_query*/) {
    return LogPositiveFeatures(in, params.at(0));
  };
  map.params = {form.w_MR};
  map.positive_features = true;
  if (!form.input_map_NRD.defined()) {
    map.input_scale = root_scale;
  } else {
    // x = sqrt(s) M q as one product with sqrt(s) M. M per query head makes keys per query head.
    const auto dtype = FeatureDtype(q_BHLD.scalar_type());
    map.params.push_back((form.input_map_NRD.to(dtype) * root_scale).transpose(-1, -2).unsqueeze(0));
    map.input_map = true;
    map.keys_per_query_head = form.input_map_NRD.size(0) > 1;
  }
  map.op = options_.op;
  map.sub_chunk = options_.sub_chunk;
  map.segment_chunks = options_.segment_chunks;
  map.exponential_pairs = options_.exponential_pairs;
  map.precompute_features = options_.precompute_features;
  map.num_features = form.w_MR.size(0);
  map.input_dtype = q_BHLD.scalar_type();
  // q, k and v as given: the operator maps them (op: cuda inside, so autograd keeps them as they
  // are; the other forms up front, in fp32).
  return FusedCausalLinearAttention(q_BHLD, k_BKLD, v_BKLD, map, options_.chunk_size, document_ids_BL)
      .to(v_BKLD.scalar_type());
}

namespace {

struct RecurrentState : DecodeState {
  LinearAttentionState sums;
  int64_t Bytes() const override { return NbytesOrZero(sums.state_BKFMV) + NbytesOrZero(sums.ref_BKFM); }
};

}  // namespace

torch::Tensor LogFeatureKernel::Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD,
                                        const torch::Tensor& k_BKTD, const torch::Tensor& v_BKTD,
                                        const AttentionCall& call) {
  NoAutocastGuard fp32;
  if (!state) state = std::make_unique<RecurrentState>();
  auto& s = dynamic_cast<RecurrentState&>(*state);
  const int64_t new_tokens = q_BHTD.size(2);
  const auto dtype = FeatureDtype(q_BHTD.scalar_type());
  const double root_scale = std::sqrt(call.scale);
  auto map = MakeFeatureMap();
  map.input_dtype = q_BHTD.scalar_type();
  const auto y_BKTD = k_BKTD.to(dtype) * root_scale, v_f_BKTD = v_BKTD.to(dtype);
  if (s.tokens == 0 && new_tokens > 1) {
    // Prompt: the outputs exactly as forward() gives them, then the state after the last token.
    AttentionCall causal = call;
    causal.causal = true;
    const auto out_BHTD = forward(q_BHTD, k_BKTD, v_BKTD, causal);
    s.sums = LinearAttentionPrefillState(y_BKTD, v_f_BKTD, map, q_BHTD.size(1), options_.chunk_size);
    s.tokens = new_tokens;
    return out_BHTD;
  }
  const auto x_BHTD = q_BHTD.to(dtype) * root_scale;
  std::vector<torch::Tensor> outs;
  for (int64_t t = 0; t < new_tokens; ++t) {
    outs.push_back(LinearAttentionStep(s.sums, x_BHTD.narrow(2, t, 1), y_BKTD.narrow(2, t, 1), v_f_BKTD.narrow(2, t, 1), map));
  }
  s.tokens += new_tokens;
  return torch::cat(outs, 2).to(v_BKTD.scalar_type());
}

torch::Tensor LogFeatureKernel::PairEstimate(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const {
  return torch::exp(LogFeatures(x_BHPD) + LogFeatures(y_BHPD, /*is_query=*/false)).sum(-1);
}

}  // namespace darkformer
