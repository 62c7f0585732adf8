// Shared machinery of the positive-random-feature kernels (see feature_kernel_base.h).
#include "attention/feature_kernel_base.h"

#include <cmath>

#include "attention/causal_linear_attention.h"
#include "attention/positive_features.h"
#include "util/mixed_precision.h"

namespace darkformer {

FeatureKernelOptions FeatureKernelOptions::Read(const ConfigReader& reader, bool with_redraw) {
  FeatureKernelOptions o;
  o.num_features = reader.Get<int64_t>("num_features", o.num_features);
  DF_CHECK(o.num_features > 0, "config key '" << reader.KeyPath("num_features") << "' must be positive, got " << o.num_features);
  o.projection = ParseProjectionKind(reader.Get<std::string>("projection", "orthogonal"), reader.KeyPath("projection"));
  o.seed = reader.Get<int64_t>("seed", o.seed);
  o.chunk_size = reader.Get<int64_t>("chunk_size", o.chunk_size);
  DF_CHECK(o.chunk_size > 0, "config key '" << reader.KeyPath("chunk_size") << "' must be positive, got " << o.chunk_size);
  DF_CHECK(!(reader.Has("fused") && reader.Has("op")),
           "config keys '" << reader.KeyPath("fused") << "' and '" << reader.KeyPath("op")
                           << "' both set: `op` replaces `fused` (fused: false is op: naive); keep one");
  if (reader.Has("fused")) o.op = reader.Get<bool>("fused", true) ? CausalOp::kAuto : CausalOp::kNaive;
  o.op = ParseCausalOp(reader.Get<std::string>("op", CausalOpName(o.op)), reader.KeyPath("op"));
  if (!with_redraw) return o;
  o.redraw = reader.GetEnum("redraw", o.redraw,
                             {{"never", RedrawPolicy::kNever},
                              {"every_step", RedrawPolicy::kEveryStep},
                              {"every_n", RedrawPolicy::kEveryN}});
  o.redraw_interval = reader.Get<int64_t>("redraw_interval", o.redraw_interval);
  DF_CHECK(o.redraw_interval > 0, "config key '" << reader.KeyPath("redraw_interval") << "' must be positive, got " << o.redraw_interval);
  return o;
}

FeatureKernelBase::FeatureKernelBase(const KernelShape& shape, FeatureKernelOptions options)
    : shape_(shape), options_(options) {}

void FeatureKernelBase::RegisterDraw(int64_t dim) {
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  // Per-layer seeds differ so layers do not share draws.
  draw_seed_ = register_buffer("draw_seed", torch::tensor({KernelSeed(options_.seed, shape_)}, i64));
  draw_count_ = register_buffer("draw_count", torch::zeros({1}, i64));
  projection_ = register_buffer(
      "projection", DrawProjection(options_.projection, options_.num_features, dim, DrawSeed(KernelSeed(options_.seed, shape_), 0)));
}

int64_t FeatureKernelBase::draw_count() const { return draw_count_.defined() ? draw_count_.item<int64_t>() : 0; }

void FeatureKernelBase::Redraw() {
  if (!projection_.defined()) return;
  torch::NoGradGuard no_grad;
  const int64_t next = draw_count() + 1;
  const auto seed = static_cast<uint64_t>(draw_seed_.item<int64_t>());
  const auto w = DrawProjection(options_.projection, projection_.size(0), projection_.size(1), DrawSeed(seed, next));
  projection_.copy_(w.to(projection_.options()));
  draw_count_.fill_(next);
}

void FeatureKernelBase::on_train_step(int64_t step) {
  if (options_.redraw == RedrawPolicy::kEveryStep) Redraw();
  if (options_.redraw == RedrawPolicy::kEveryN && step > 0 && step % options_.redraw_interval == 0) Redraw();
}

void FeatureKernelBase::to(torch::Dtype dtype, bool non_blocking) { ConvertState(std::nullopt, dtype, non_blocking); }

void FeatureKernelBase::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  ConvertState(device, dtype, non_blocking);
}

void FeatureKernelBase::ConvertState(const std::optional<torch::Device>& device, torch::Dtype dtype, bool non_blocking) {
  const auto target = dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto convert = [&](const torch::Tensor& t) {
    const auto type = t.is_floating_point() ? target : t.scalar_type();
    return device ? t.to(*device, type, non_blocking) : t.to(type, non_blocking);
  };
  for (auto& p : named_parameters(/*recurse=*/false)) p->set_data(convert(*p));
  for (auto& b : named_buffers(/*recurse=*/false)) b->set_data(convert(*b));
}

FeatureMap FeatureKernelBase::MakeFeatureMap() const {
  FeatureMap map;
  // The kernel module outlives any graph built from it (it owns the parameters the graph reads).
  map.log_features = [this](const torch::Tensor& x, const std::vector<torch::Tensor>& params, bool is_query) {
    return LogFeaturesWith(x, params, is_query);
  };
  map.params = FeatureParams();
  map.keys_per_query_head = KeysPerQueryHead();
  map.params_per_head = FeatureParamsPerHead();
  map.op = options_.op;
  return map;
}

torch::Tensor FeatureKernelBase::forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD,
                                         const torch::Tensor& v_BKLD, const AttentionCall& call) {
  NoAutocastGuard fp32;  // features, M q, running sums: fp32 even when called inside autocast
  const auto dtype = FeatureDtype(q_BHLD.scalar_type());
  const double root_scale = std::sqrt(call.scale);
  const bool fused = options_.op != CausalOp::kNaive;
  if (call.causal && fused) {
    if (const auto form = PositiveForm()) return ForwardPositiveFused(*form, q_BHLD, k_BKLD, v_BKLD, root_scale);
  }
  const auto x_BHLD = q_BHLD.to(dtype) * root_scale;
  if (call.causal && fused) {
    // One operator, key features once per KV head (fused_causal_attention.h).
    const auto y_BKLD = k_BKLD.to(dtype) * root_scale;
    const auto out_BHLD = FusedCausalLinearAttention(x_BHLD, y_BKLD, v_BKLD.to(dtype), MakeFeatureMap(), options_.chunk_size);
    return out_BHLD.to(v_BKLD.scalar_type());
  }
  // The naive composite path (the reference the fused operator is tested against).
  const int64_t heads = q_BHLD.size(1);
  const auto y_BHLD = RepeatKvHeads(k_BKLD, heads).to(dtype) * root_scale;
  const auto v_BHLD = RepeatKvHeads(v_BKLD, heads);
  const auto query_BHLM = StabilisedQueryFeatures(LogFeatures(x_BHLD, /*is_query=*/true));
  const auto key = StabilisedKeyFeatures(LogFeatures(y_BHLD, /*is_query=*/false));
  const auto out_BHLD = LinearAttention(query_BHLM, key.features_BHLM, key.log_scale_BHL, v_BHLD, call.causal,
                                        options_.chunk_size);
  return out_BHLD.to(v_BHLD.scalar_type());
}

torch::Tensor FeatureKernelBase::ForwardPositiveFused(const PositiveFeatureForm& form, const torch::Tensor& q_BHLD,
                                                      const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD,
                                                      double root_scale) const {
  const auto dtype = FeatureDtype(q_BHLD.scalar_type());
  torch::Tensor x, y, v = v_BKLD.to(dtype);
  if (!form.input_map_NRD.defined()) {
    x = q_BHLD.to(dtype) * root_scale;
    y = k_BKLD.to(dtype) * root_scale;
  } else {
    // x = sqrt(s) M q as one product with sqrt(s) M: autograd then keeps q and k (alive anyway)
    // for M's gradient instead of scaled copies of them.
    const auto a_1NDR = (form.input_map_NRD.to(dtype) * root_scale).transpose(-1, -2).unsqueeze(0);
    x = torch::matmul(q_BHLD.to(dtype), a_1NDR);
    y = k_BKLD.to(dtype);
    if (form.input_map_NRD.size(0) > 1) {
      // M per query head makes keys per query head: the operator then sees H KV heads.
      const int64_t heads = q_BHLD.size(1);
      y = RepeatKvHeads(y, heads);
      v = RepeatKvHeads(v, heads);
    }
    y = torch::matmul(y, a_1NDR);
  }
  FeatureMap map;
  map.log_features = [](const torch::Tensor& in, const std::vector<torch::Tensor>& params, bool /*is_query*/) {
    return LogPositiveFeatures(in, params.at(0));
  };
  map.params = {form.w_MR};
  map.positive_features = true;
  map.op = options_.op;
  return FusedCausalLinearAttention(x, y, v, map, options_.chunk_size).to(v_BKLD.scalar_type());
}

namespace {

struct RecurrentState : DecodeState {
  LinearAttentionState sums;
  int64_t Bytes() const override { return NbytesOrZero(sums.state_BKFMV) + NbytesOrZero(sums.ref_BKF); }
};

}  // namespace

torch::Tensor FeatureKernelBase::Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD,
                                        const torch::Tensor& k_BKTD, const torch::Tensor& v_BKTD,
                                        const AttentionCall& call) {
  NoAutocastGuard fp32;
  if (!state) state = std::make_unique<RecurrentState>();
  auto& s = dynamic_cast<RecurrentState&>(*state);
  const int64_t new_tokens = q_BHTD.size(2);
  const auto dtype = FeatureDtype(q_BHTD.scalar_type());
  const double root_scale = std::sqrt(call.scale);
  const auto map = MakeFeatureMap();
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

}  // namespace darkformer
