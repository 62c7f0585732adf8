// Per-layer attention magnitudes (see attention_stats.h).
#include "train/attention_stats.h"

#include <cmath>
#include <limits>

#include "attention/exact_kernel.h"
#include "attention/feature_kernel_base.h"

namespace darkformer {

std::vector<LayerAttentionStats> MeasureAttention(GemmaModelImpl& model, const torch::Tensor& input_ids_BL) {
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const int64_t length = input_ids_BL.size(1);
  std::vector<LayerAttentionStats> stats;
  auto x_BLE = model.LayerInput(input_ids_BL, 0);
  for (int64_t i = 0; i < model.config().num_hidden_layers; ++i) {
    auto layer = model.layers[i]->as<DecoderLayerImpl>();
    const auto rope = model.RopeFor(i, length, input_ids_BL.device());
    auto attention = model.attention_layer(i);
    auto [q_BHLD, k_BHLD] = attention->QueriesKeys(layer->input_layernorm(x_BLE), rope);
    q_BHLD = q_BHLD.to(torch::kFloat32);
    k_BHLD = k_BHLD.to(torch::kFloat32);
    const auto& call = attention->call();
    const double scale = call.scale;
    const auto allowed_LL = MakeAllowedMask(length, call.causal, call.sliding_window, input_ids_BL.device());
    const auto logits_BHLL = torch::matmul(q_BHLD, k_BHLD.transpose(-1, -2)).mul(scale).abs();
    LayerAttentionStats s;
    s.layer = i;
    s.kernel = attention->kernel()->kernel_name();
    s.max_logit = logits_BHLL.masked_fill(allowed_LL.logical_not(), 0.0).max().item<double>();
    s.max_log_feature = std::numeric_limits<double>::quiet_NaN();
    if (auto* features = dynamic_cast<FeatureKernelBase*>(attention->kernel().get())) {
      s.max_log_feature = features->LogFeatures(q_BHLD * std::sqrt(scale)).max().item<double>();
    }
    stats.push_back(s);
    x_BLE = layer->forward(x_BLE, rope);
  }
  if (was_training) model.train();
  return stats;
}

}  // namespace darkformer
