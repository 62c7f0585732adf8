// Parameter names and sizes as GemmaModel registers them, the kernels' buffers, and byte
// formatting (see memory_estimate.h).
#include "train/memory_estimate.h"

#include <fmt/format.h>

#include "attention/kernel_registry.h"

namespace darkformer {

std::vector<NamedSize> ModelParameterSizes(const GemmaConfig& model, const AttentionConfig& attention) {
  GemmaConfig m = model;
  m.Finalize();
  const int64_t E = m.hidden_size, HD = m.num_attention_heads * m.head_dim, KD = m.num_key_value_heads * m.head_dim;
  std::vector<NamedSize> out;
  out.push_back({"embed_tokens.weight", m.vocab_size * E});
  const bool sandwich = m.Family() != GemmaFamily::kGemma1;
  for (int64_t i = 0; i < m.num_hidden_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    out.push_back({p + "input_layernorm.weight", E});
    out.push_back({p + "self_attn.q_proj.weight", HD * E});
    out.push_back({p + "self_attn.k_proj.weight", KD * E});
    out.push_back({p + "self_attn.v_proj.weight", KD * E});
    out.push_back({p + "self_attn.o_proj.weight", E * HD});
    if (m.Family() == GemmaFamily::kGemma3) {
      out.push_back({p + "self_attn.q_norm.weight", m.head_dim});
      out.push_back({p + "self_attn.k_norm.weight", m.head_dim});
    }
    const std::string name = attention.KernelForLayer(i);
    const auto kernel = MakeAttentionKernel(name, KernelShape{m.num_attention_heads, m.head_dim, i},
                                            attention.OptionsFor(name));
    for (const auto& q : kernel->named_parameters()) out.push_back({p + "self_attn.kernel." + q.key(), q.value().numel()});
    out.push_back({p + "post_attention_layernorm.weight", E});
    if (sandwich) {
      out.push_back({p + "pre_feedforward_layernorm.weight", E});
      out.push_back({p + "post_feedforward_layernorm.weight", E});
    }
    out.push_back({p + "mlp.gate_proj.weight", m.intermediate_size * E});
    out.push_back({p + "mlp.up_proj.weight", m.intermediate_size * E});
    out.push_back({p + "mlp.down_proj.weight", E * m.intermediate_size});
  }
  out.push_back({"norm.weight", E});
  return out;
}

int64_t ModelBufferBytes(const GemmaConfig& model, const AttentionConfig& attention) {
  int64_t bytes = 0;
  for (int64_t i = 0; i < model.num_hidden_layers; ++i) {
    const std::string name = attention.KernelForLayer(i);
    const auto kernel = MakeAttentionKernel(name, KernelShape{model.num_attention_heads, model.head_dim, i},
                                            attention.OptionsFor(name));
    for (const auto& b : kernel->buffers()) bytes += static_cast<int64_t>(b.nbytes());
  }
  return bytes;
}

std::string FormatBytes(int64_t bytes) {
  std::string digits = std::to_string(bytes), commas;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) commas += ',';
    commas += digits[i];
  }
  return fmt::format("{:.2f} GiB ({} bytes)", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0), commas);
}

}  // namespace darkformer
