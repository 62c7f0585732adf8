// Gemma decoder block (see decoder_layer.h).
#include "model/decoder_layer.h"

#include <algorithm>

namespace darkformer {

DecoderLayerImpl::DecoderLayerImpl(const GemmaConfig& config, int64_t layer_index, AttentionKernel kernel)
    : sandwich_norms_(config.Family() != GemmaFamily::kGemma1) {
  const int64_t e = config.hidden_size;
  const double eps = config.rms_norm_eps;
  input_layernorm = register_module("input_layernorm", RmsNorm(e, eps));
  self_attn = register_module("self_attn", AttentionLayer(config, layer_index, std::move(kernel)));
  // In Gemma 1 "post_attention_layernorm" is the MLP's pre-norm (HF's name, kept for conversion).
  post_attention_layernorm = register_module("post_attention_layernorm", RmsNorm(e, eps));
  if (sandwich_norms_) {
    pre_feedforward_layernorm = register_module("pre_feedforward_layernorm", RmsNorm(e, eps));
    post_feedforward_layernorm = register_module("post_feedforward_layernorm", RmsNorm(e, eps));
  }
  mlp = register_module("mlp", GatedMlp(e, config.intermediate_size));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x_BLE, const RotaryTables& rope,
                                        std::unique_ptr<DecodeState>* state) {
  const auto normed_BLE = input_layernorm(x_BLE);
  const auto attended_BLE = state ? self_attn->Decode(normed_BLE, rope, *state) : self_attn(normed_BLE, rope);
  if (!sandwich_norms_) {
    const auto h = x_BLE + attended_BLE;
    return h + mlp(post_attention_layernorm(h));
  }
  const auto h = x_BLE + post_attention_layernorm(attended_BLE);
  return h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
}

DecoderLayerImpl::Shadowed DecoderLayerImpl::ShadowForward(shadow::Tape& tape, const ShadowAttentionCall& call,
                                                           const shadow::Shadow& x) const {
  using shadow::kBf16;
  using shadow::kF32;
  const int64_t e = input_layernorm->weight.size(0), inner = mlp->gate_proj->weight.size(0);
  const auto attended = self_attn->ShadowForward(tape, call, tape.RmsNorm(x, ShadowParameter(input_layernorm->weight), e));
  auto norm = [&](const shadow::Shadow& in, const RmsNorm& n) { return tape.RmsNorm(in, ShadowParameter(n->weight), e); };
  auto feed_forward = [&](const shadow::Shadow& in) {
    const auto gate = tape.Linear(in, ShadowParameter(mlp->gate_proj->weight), e, inner);
    const auto up = tape.Linear(in, ShadowParameter(mlp->up_proj->weight), e, inner);
    return tape.Linear(tape.Mul(tape.Gelu(gate), up), ShadowParameter(mlp->down_proj->weight), inner, e);
  };
  shadow::Shadow out;
  if (!sandwich_norms_) {
    const auto h = tape.Add(x, attended.out);
    out = tape.Add(h, feed_forward(norm(h, post_attention_layernorm)));
  } else {
    const auto h = tape.Add(x, norm(attended.out, post_attention_layernorm));
    out = tape.Add(h, norm(feed_forward(norm(h, pre_feedforward_layernorm)), post_feedforward_layernorm));
  }
  const int64_t tokens = call.batch * call.length;
  Shadowed r;
  r.out = {tokens * e, kF32, out.rg, -1};
  // The backward: the gradients of the output and input (fp32), and the MLP's at its widest (the
  // gradients of gelu(g) * u's three T x I operands) or the kernel's, plus a bf16 weight gradient
  // before its conversion to fp32.
  const int64_t mlp_grads = 3 * tokens * inner * tape.act();
  const int64_t weight_cast = tape.bf16() ? kBf16 * e * inner : 0;
  r.backward_bytes = 2 * tokens * e * kF32 + std::max(mlp_grads, attended.backward_bytes) + weight_cast;
  r.note = attended.note;
  return r;
}

}  // namespace darkformer
