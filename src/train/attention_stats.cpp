// Per-layer attention magnitudes (see attention_stats.h).
#include "train/attention_stats.h"

#include <cmath>
#include <limits>

#include "attention/exact_kernel.h"

namespace darkformer {

std::vector<LayerAttentionStats> MeasureAttention(GemmaModelImpl& model, const torch::Tensor& input_ids_BL) {
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const int64_t length = input_ids_BL.size(1);
  std::vector<LayerAttentionStats> stats;
  model.ForEachAttentionInput(input_ids_BL, [&](const GemmaModelImpl::AttentionInput& in) {
    auto [q_BHLD, k_BHLD] = in.attention.QueriesKeys(in.h_BLE, in.rope);
    q_BHLD = q_BHLD.to(torch::kFloat32);
    k_BHLD = k_BHLD.to(torch::kFloat32);
    const auto& call = in.attention.call();
    const double scale = call.scale;
    const auto allowed_LL = MakeAllowedMask(length, call.causal, call.sliding_window, input_ids_BL.device());
    const auto logits_BHLL = torch::matmul(q_BHLD, k_BHLD.transpose(-1, -2)).mul(scale).abs();
    LayerAttentionStats s;
    s.layer = in.layer;
    s.kernel = in.attention.kernel()->kernel_name();
    s.max_logit = logits_BHLL.masked_fill(allowed_LL.logical_not(), 0.0).max().item<double>();
    s.max_log_feature = in.attention.kernel()->MaxLogFeature(q_BHLD * std::sqrt(scale));
    stats.push_back(s);
  });
  if (was_training) model.train();
  return stats;
}

}  // namespace darkformer
