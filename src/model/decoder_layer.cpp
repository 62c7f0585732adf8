// Gemma decoder block (see decoder_layer.h).
#include "model/decoder_layer.h"

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

}  // namespace darkformer
