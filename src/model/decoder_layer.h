// One Gemma decoder block. Gemma 1: pre-norm attention and MLP. Gemma 2/3 add a norm on each
// branch's output (post_attention_layernorm, post_feedforward_layernorm). Names follow HF.
#pragma once

#include <torch/torch.h>

#include "model/attention_layer.h"
#include "model/gated_mlp.h"

namespace darkformer {

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const GemmaConfig& config, int64_t layer_index, AttentionKernel kernel);
  // `state` non-null: generation, x_BLE holds new tokens and attention runs incrementally.
  torch::Tensor forward(const torch::Tensor& x_BLE, const RotaryTables& rope,
                        std::unique_ptr<DecodeState>* state = nullptr);

  // What forward() saves for the backward, replayed on sizes (the memory estimate): `x` is the
  // layer's input on `tape`. Returns the output (the fp32 residual stream) and the bytes the
  // backward holds at its widest beyond what was saved.
  struct Shadowed {
    shadow::Shadow out;
    int64_t backward_bytes = 0;
    std::string note;  // the attention's (ShadowAttention::note)
  };
  Shadowed ShadowForward(shadow::Tape& tape, const ShadowAttentionCall& call, const shadow::Shadow& x) const;

  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  RmsNorm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};  // Gemma 2/3
  AttentionLayer self_attn{nullptr};
  GatedMlp mlp{nullptr};

 private:
  bool sandwich_norms_;
};
TORCH_MODULE(DecoderLayer);

}  // namespace darkformer
