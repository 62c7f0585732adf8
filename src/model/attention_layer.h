// Gemma self-attention: owns q/k/v/o projections, Gemma 3's per-head q/k norms and RoPE; the
// step from (q, k, v) to the output is the swappable AttentionKernel picked by name.
#pragma once

#include <torch/torch.h>

#include "attention/attention_kernel.h"
#include "model/gemma_config.h"
#include "model/rms_norm.h"
#include "model/rotary_embedding.h"

namespace darkformer {

class AttentionLayerImpl : public torch::nn::Module {
 public:
  AttentionLayerImpl(const GemmaConfig& config, int64_t layer_index, AttentionKernel kernel);
  // x_BLE -> out_BLE. `rope` holds this layer's tables for the sequence length.
  torch::Tensor forward(const torch::Tensor& x_BLE, const RotaryTables& rope);
  // Queries and keys as the kernel sees them (after norms and RoPE, before the scale), for
  // diagnostics and calibration: {q_BHLD, k_BHLD} with k repeated to H heads.
  std::pair<torch::Tensor, torch::Tensor> QueriesKeys(const torch::Tensor& x_BLE, const RotaryTables& rope);
  // Generation: x_BTE holds T new tokens, `rope` their positions' tables; the kernel's decoding
  // state carries everything before them (AttentionKernelImpl::Decode).
  torch::Tensor Decode(const torch::Tensor& x_BTE, const RotaryTables& rope, std::unique_ptr<DecodeState>& state);

  // What forward() saves for the backward, replayed on sizes (the memory estimate): `x` is the
  // normed input on `tape` (call: batch, length, documents, device); returns o_proj's output and
  // the kernel's backward extra.
  ShadowAttention ShadowForward(shadow::Tape& tape, ShadowAttentionCall call, const shadow::Shadow& x) const;

  // Replaces the kernel (the paper's finetuning swap); projections are untouched.
  void SetKernel(AttentionKernel kernel);
  AttentionKernel kernel() const { return kernel_; }
  const AttentionCall& call() const { return call_; }

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RmsNorm q_norm{nullptr}, k_norm{nullptr};  // Gemma 3 only

 private:
  struct Projected {
    torch::Tensor q_BHLD, k_BKLD, v_BKLD;  // k, v with the KV heads (not repeated)
  };
  Projected Project(const torch::Tensor& x_BLE, const RotaryTables& rope);
  // The kernel's out_BHLD through o_proj, back in the residual stream's dtype.
  torch::Tensor Output(const torch::Tensor& out_BHLD, const torch::Tensor& x_BLE);

  int64_t num_heads_, num_kv_heads_, head_dim_;
  AttentionCall call_;
  AttentionKernel kernel_{nullptr};
};
TORCH_MODULE(AttentionLayer);

}  // namespace darkformer
