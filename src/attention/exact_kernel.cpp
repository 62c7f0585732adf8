// Exact softmax attention (see exact_kernel.h).
#include "attention/exact_kernel.h"

namespace darkformer {

torch::Tensor MakeAllowedMask(int64_t length, bool causal, int64_t sliding_window, const torch::Device& device) {
  const auto idx = torch::arange(length, torch::TensorOptions().dtype(torch::kLong).device(device));
  const auto diff_LL = idx.unsqueeze(1) - idx.unsqueeze(0);  // i - j
  auto allowed = torch::ones({length, length}, torch::TensorOptions().dtype(torch::kBool).device(device));
  if (causal) allowed = allowed & (diff_LL >= 0);
  // HF semantics: a sliding layer sees keys with i - j < window (the current token included).
  if (sliding_window > 0) allowed = allowed & (diff_LL < sliding_window) & (diff_LL > -sliding_window);
  return allowed;
}

ExactKernelImpl::ExactKernelImpl(const KernelShape& /*shape*/, const ConfigReader& options) {
  force_explicit_ = options.Get<bool>("explicit_softmax", false);
  options.RejectUnknown();
}

torch::Tensor ExactKernelImpl::forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD,
                                       const torch::Tensor& v_BKLD, const AttentionCall& call) {
  const auto k_BHLD = RepeatKvHeads(k_BKLD, q_BHLD.size(1));
  const auto v_BHLD = RepeatKvHeads(v_BKLD, q_BHLD.size(1));
  const int64_t length = q_BHLD.size(2);
  if (call.softcap <= 0.0 && !force_explicit_) {
    if (call.sliding_window <= 0 || call.sliding_window >= length) {
      return at::scaled_dot_product_attention(q_BHLD, k_BHLD, v_BHLD, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                              /*is_causal=*/call.causal, /*scale=*/call.scale);
    }
    const auto allowed = MakeAllowedMask(length, call.causal, call.sliding_window, q_BHLD.device());
    return at::scaled_dot_product_attention(q_BHLD, k_BHLD, v_BHLD, allowed, 0.0, false, call.scale);
  }
  // Soft-capped logits (Gemma 2): softcap * tanh(s q.k / softcap), softmax in fp32.
  auto logits_BHLL = torch::matmul(q_BHLD.to(torch::kFloat32), k_BHLD.to(torch::kFloat32).transpose(-1, -2)) * call.scale;
  if (call.softcap > 0.0) logits_BHLL = torch::tanh(logits_BHLL / call.softcap) * call.softcap;
  const auto allowed = MakeAllowedMask(length, call.causal, call.sliding_window, q_BHLD.device());
  logits_BHLL = logits_BHLL.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  const auto weights_BHLL = torch::softmax(logits_BHLL, -1).to(v_BHLD.scalar_type());
  return torch::matmul(weights_BHLL, v_BHLD);
}

}  // namespace darkformer
