// Gemma self-attention layer (see attention_layer.h).
#include "model/attention_layer.h"

#include <optional>

#include "util/mixed_precision.h"

namespace darkformer {

AttentionLayerImpl::AttentionLayerImpl(const GemmaConfig& config, int64_t layer_index, AttentionKernel kernel)
    : num_heads_(config.num_attention_heads),
      num_kv_heads_(config.num_key_value_heads),
      head_dim_(config.head_dim) {
  auto linear = [](int64_t in, int64_t out) { return torch::nn::LinearOptions(in, out).bias(false); };
  const int64_t e = config.hidden_size;
  q_proj = register_module("q_proj", torch::nn::Linear(linear(e, num_heads_ * head_dim_)));
  k_proj = register_module("k_proj", torch::nn::Linear(linear(e, num_kv_heads_ * head_dim_)));
  v_proj = register_module("v_proj", torch::nn::Linear(linear(e, num_kv_heads_ * head_dim_)));
  o_proj = register_module("o_proj", torch::nn::Linear(linear(num_heads_ * head_dim_, e)));
  if (config.Family() == GemmaFamily::kGemma3) {
    q_norm = register_module("q_norm", RmsNorm(head_dim_, config.rms_norm_eps));
    k_norm = register_module("k_norm", RmsNorm(head_dim_, config.rms_norm_eps));
  }
  call_.causal = true;
  call_.scale = config.QueryScale();
  call_.softcap = config.attn_logit_softcapping;
  call_.sliding_window = config.IsSliding(layer_index) ? config.sliding_window : 0;
  SetKernel(std::move(kernel));
}

void AttentionLayerImpl::SetKernel(AttentionKernel kernel) {
  kernel_ = kernel;
  // replace_module keeps the parameter name "kernel.*" stable across swaps.
  if (named_children().contains("kernel")) {
    replace_module("kernel", kernel_);
  } else {
    register_module("kernel", kernel_);
  }
}

AttentionLayerImpl::Projected AttentionLayerImpl::Project(const torch::Tensor& x_BLE, const RotaryTables& rope) {
  const int64_t batch = x_BLE.size(0), length = x_BLE.size(1);
  auto q_BHLD = q_proj(x_BLE).view({batch, length, num_heads_, head_dim_}).transpose(1, 2);
  auto k_BKLD = k_proj(x_BLE).view({batch, length, num_kv_heads_, head_dim_}).transpose(1, 2);
  auto v_BKLD = v_proj(x_BLE).view({batch, length, num_kv_heads_, head_dim_}).transpose(1, 2);
  if (q_norm) {
    q_BHLD = q_norm(q_BHLD);
    k_BKLD = k_norm(k_BKLD);
  }
  q_BHLD = ApplyRotary(q_BHLD, rope);
  k_BKLD = ApplyRotary(k_BKLD, rope);
  // Grouped / multi-query attention: k and v keep their K heads; the kernel maps query head h to
  // KV head h / (H / K) (feature kernels compute key features once per KV head).
  return {q_BHLD, k_BKLD, v_BKLD};
}

torch::Tensor AttentionLayerImpl::forward(const torch::Tensor& x_BLE, const RotaryTables& rope) {
  const auto p = Project(x_BLE, rope);
  torch::Tensor out_BHLD;
  {
    // Projections run under the caller's autocast (bf16 GEMMs); a kernel that computes in fp32
    // runs with autocast excluded (attention_kernel.h: autocast_inside).
    std::optional<NoAutocastGuard> fp32;
    if (!kernel_->autocast_inside()) fp32.emplace();
    AttentionCall call = call_;
    call.document_ids_BL = rope.document_ids_BL;  // packed windows: attention stays in each document
    out_BHLD = kernel_->Attend(p.q_BHLD, p.k_BKLD, p.v_BKLD, call);
  }
  return Output(out_BHLD, x_BLE);
}

torch::Tensor AttentionLayerImpl::Decode(const torch::Tensor& x_BTE, const RotaryTables& rope,
                                         std::unique_ptr<DecodeState>& state) {
  const auto p = Project(x_BTE, rope);
  torch::Tensor out_BHTD;
  {
    std::optional<NoAutocastGuard> fp32;
    if (!kernel_->autocast_inside()) fp32.emplace();
    out_BHTD = kernel_->Decode(state, p.q_BHLD, p.k_BKLD, p.v_BKLD, call_);
  }
  return Output(out_BHTD, x_BTE);
}

torch::Tensor AttentionLayerImpl::Output(const torch::Tensor& out_BHLD, const torch::Tensor& x_BLE) {
  const int64_t batch = x_BLE.size(0), length = x_BLE.size(1);
  return o_proj(out_BHLD.to(x_BLE.scalar_type()).transpose(1, 2).reshape({batch, length, num_heads_ * head_dim_}));
}

ShadowAttention AttentionLayerImpl::ShadowForward(shadow::Tape& tape, ShadowAttentionCall call,
                                                  const shadow::Shadow& x) const {
  const int64_t e = q_proj->weight.size(1), hd = num_heads_ * head_dim_, kd = num_kv_heads_ * head_dim_;
  auto q = tape.Linear(x, ShadowParameter(q_proj->weight), e, hd);
  auto k = tape.Linear(x, ShadowParameter(k_proj->weight), e, kd);
  const auto v = tape.Linear(x, ShadowParameter(v_proj->weight), e, kd);
  if (q_norm) {
    q = tape.RmsNorm(q, ShadowParameter(q_norm->weight), head_dim_);
    k = tape.RmsNorm(k, ShadowParameter(k_norm->weight), head_dim_);
  }
  q = tape.Rope(q);
  k = tape.Rope(k);
  call.heads = num_heads_;
  call.key_heads = num_kv_heads_;
  call.head_dim = head_dim_;
  call.softcap = call_.softcap;
  auto attended = kernel_->ShadowForward(tape, call, q, k, v);
  // out.to(x's dtype), transposed to B L H D: a copy.
  const auto merged = tape.Copy(tape.To(attended.out, x.esz));
  attended.out = tape.Linear(merged, ShadowParameter(o_proj->weight), hd, e);
  return attended;
}

std::pair<torch::Tensor, torch::Tensor> AttentionLayerImpl::QueriesKeys(const torch::Tensor& x_BLE,
                                                                        const RotaryTables& rope) {
  const auto p = Project(x_BLE, rope);
  return {p.q_BHLD, RepeatKvHeads(p.k_BKLD, num_heads_)};
}

}  // namespace darkformer
