// Model FLOPs per token (see model_flops.h).
#include "train/model_flops.h"

#include "attention/attention_flops.h"
#include "model/linear_weights.h"

namespace darkformer {

namespace {

bool MatmulWeight(const std::string& name) {
  return IsLinearWeight(name) || name == "embed_tokens.weight";  // the LM head is the tied embedding
}

}  // namespace

ModelFlops CountModelFlops(GemmaModelImpl& model, int64_t seq_len) {
  ModelFlops f;
  for (const auto& item : model.named_parameters()) {
    if (!MatmulWeight(item.key())) continue;
    f.matmul_weights += item.value().numel();
    if (item.value().requires_grad()) f.trainable_matmul_weights += item.value().numel();
  }
  const auto& c = model.config();
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    f.attention_forward_per_token += AttentionForwardFlopsPerToken(
        *model.attention_layer(layer)->kernel(), c.num_attention_heads, c.num_key_value_heads, c.head_dim, seq_len);
  }
  f.per_token = 4.0 * static_cast<double>(f.matmul_weights) + 2.0 * static_cast<double>(f.trainable_matmul_weights) +
                3.0 * f.attention_forward_per_token;
  return f;
}

double PeakFlops(double configured_tflops, const std::string& device_name) {
  if (configured_tflops > 0) return configured_tflops * 1e12;
  if (device_name.find("H100") != std::string::npos || device_name.find("H200") != std::string::npos) return 989e12;
  if (device_name.find("A100") != std::string::npos) return 312e12;
  return 0;
}

}  // namespace darkformer
