// The Gemma causal language model (see gemma_model.h).
#include "model/gemma_model.h"

#include "attention/document_mask.h"

#include <spdlog/spdlog.h>

#include <cmath>

#include "attention/kernel_registry.h"
#include "model/checkpointed_layer.h"
#include "model/linear_cross_entropy.h"
#include "util/error.h"
#include "util/labels.h"
#include "util/shapes_only.h"

namespace darkformer {

GemmaModelImpl::GemmaModelImpl(GemmaConfig config, AttentionConfig attention)
    : config_(std::move(config)), attention_(std::move(attention)) {
  config_.Finalize();
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(config_.vocab_size, config_.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    layers_.push_back(DecoderLayer(config_, i, BuildKernel(i)));
    layers->push_back(layers_.back());
  }
  norm = register_module("norm", RmsNorm(config_.hidden_size, config_.rms_norm_eps));
  WarnUnsupportedFeatures();
}

AttentionKernel GemmaModelImpl::BuildKernel(int64_t layer) const {
  // Real even when the model is built for its shapes (the memory estimate): a kernel draws its
  // projections and reads its own values while it is built, and is small.
  RealTensorsScope real;
  const std::string name = attention_.KernelForLayer(layer);
  KernelShape shape;
  shape.num_heads = config_.num_attention_heads;
  shape.head_dim = config_.head_dim;
  shape.layer_index = layer;
  shape.run_seed = attention_.run_seed;
  return MakeAttentionKernel(name, shape, attention_.OptionsFor(name));
}

void GemmaModelImpl::WarnUnsupportedFeatures() const {
  if (embed_tokens->weight.is_meta()) return;  // built for its shapes (util/shapes_only.h): the real build warns
  std::string softcap_layers, window_layers;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const auto kernel = layers_[i]->self_attn->kernel();
    const auto& call = layers_[i]->self_attn->call();
    const std::string tag = std::to_string(i) + " (" + kernel->kernel_name() + ")";
    if (call.softcap > 0 && !kernel->supports_softcap()) softcap_layers += (softcap_layers.empty() ? "" : ", ") + tag;
    if (call.sliding_window > 0 && !kernel->supports_sliding_window())
      window_layers += (window_layers.empty() ? "" : ", ") + tag;
  }
  if (!softcap_layers.empty())
    spdlog::warn("attention logit soft-cap ({}) cannot be applied by the kernel of layers {}; they run uncapped",
                 config_.attn_logit_softcapping, softcap_layers);
  if (!window_layers.empty())
    spdlog::warn("sliding window ({}) cannot be applied by the kernel of layers {}; they attend to the full causal prefix",
                 config_.sliding_window, window_layers);
}

void GemmaModelImpl::SetAttention(const AttentionConfig& attention) {
  attention_ = attention;
  const auto device = embed_tokens->weight.device();
  const auto dtype = embed_tokens->weight.scalar_type();
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    auto kernel = BuildKernel(i);
    // Kernel parameters follow the model's device; random-feature kernels keep fp32 internally.
    kernel->to(device);
    (void)dtype;
    layers_[i]->self_attn->SetKernel(kernel);
  }
  WarnUnsupportedFeatures();
}

void GemmaModelImpl::InitializeWeights(double std, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& item : named_parameters()) {
    const auto& name = item.key();
    auto& param = item.value();
    if (name.find(".kernel.") != std::string::npos) continue;
    if (name.find("norm") != std::string::npos) {
      param.zero_();
    } else {
      param.copy_(at::normal(0.0, std, param.sizes(), generator, torch::kFloat32).to(param.options()));
    }
  }
}

torch::Tensor GemmaModelImpl::Embed(const torch::Tensor& input_ids_BL) {
  const auto x = embed_tokens(input_ids_BL);
  // HF multiplies by sqrt(hidden) cast to the activation dtype first (it matters in bf16).
  const auto normalizer = torch::scalar_tensor(std::sqrt(static_cast<double>(config_.hidden_size)),
                                               x.options().dtype(torch::kFloat32)).to(x.scalar_type());
  return x * normalizer;
}

RotaryTables GemmaModelImpl::RopeFor(int64_t layer, int64_t length, const torch::Device& device) const {
  return MakeRotaryTables(length, config_.head_dim, config_.RopeTheta(layer), config_.RopeScaling(layer), device);
}

RotaryTables GemmaModelImpl::RopeFor(int64_t layer, const torch::Tensor& input_ids_BL) const {
  auto tables = RopeFor(layer, input_ids_BL.size(1), input_ids_BL.device());
  if (!documents_.enabled()) return tables;
  tables.document_ids_BL = DocumentIdsFromTokens(input_ids_BL, documents_.separator_id);
  return documents_.restart_positions ? RotaryTablesAt(tables, PositionsInDocument(tables.document_ids_BL)) : tables;
}

torch::Tensor GemmaModelImpl::Hidden(const torch::Tensor& input_ids_BL) {
  TORCH_CHECK(input_ids_BL.dim() == 2, "input_ids must be [batch, length], got ", input_ids_BL.sizes());
  auto x = Embed(input_ids_BL);
  // Two table sets at most (sliding and full layers); build each once per forward.
  std::optional<RotaryTables> full, local;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    auto& tables = config_.layer_types[i] == "sliding_attention" ? local : full;
    if (!tables) tables = RopeFor(i, input_ids_BL);
    x = checkpoint_layers_ && torch::GradMode::is_enabled() ? CheckpointedLayerForward(layers_[i], x, *tables)
                                                             : layers_[i]->forward(x, *tables);
  }
  return norm(x);
}

torch::Tensor GemmaModelImpl::LossSum(const torch::Tensor& input_ids_BL, const torch::Tensor& labels_BL,
                                      int64_t chunk_tokens) {
  const auto hidden_BLE = Hidden(input_ids_BL);
  return LinearCrossEntropySum(hidden_BLE.reshape({-1, hidden_BLE.size(-1)}), embed_tokens->weight,
                               labels_BL.reshape({-1}), {chunk_tokens, config_.final_logit_softcapping});
}

torch::Tensor GemmaModelImpl::EvalChunked(const torch::Tensor& input_ids_BL, const torch::Tensor& labels_BL,
                                          int64_t chunk_tokens) {
  const auto hidden_BLE = Hidden(input_ids_BL);
  return LinearCrossEntropyEval(hidden_BLE.reshape({-1, hidden_BLE.size(-1)}), embed_tokens->weight,
                                labels_BL.reshape({-1}), {chunk_tokens, config_.final_logit_softcapping});
}

void GemmaModelImpl::ForEachAttentionInput(const torch::Tensor& input_ids_BL, const AttentionInputFn& fn) {
  auto x_BLE = Embed(input_ids_BL);
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const auto rope = RopeFor(i, input_ids_BL);
    const auto h_BLE = layers_[i]->input_layernorm(x_BLE);
    fn(AttentionInput{i, *layers_[i]->self_attn, h_BLE, rope});
    x_BLE = layers_[i]->forward(x_BLE, rope);
  }
}

DecodeCache GemmaModelImpl::NewDecodeCache(int64_t capacity, const torch::Device& device) const {
  DF_CHECK(capacity > 0 && capacity <= config_.max_position_embeddings,
           "generation needs " << capacity << " positions; the model has max_position_embeddings "
                               << config_.max_position_embeddings);
  DecodeCache cache;
  cache.layers.resize(config_.num_hidden_layers);
  cache.capacity = capacity;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    auto& tables = config_.layer_types[i] == "sliding_attention" ? cache.local : cache.full;
    if (!tables) tables = RopeFor(i, capacity, device);
  }
  return cache;
}

torch::Tensor GemmaModelImpl::ForwardDecode(const torch::Tensor& input_ids_BT, DecodeCache& cache) {
  DF_CHECK(input_ids_BT.dim() == 2 && input_ids_BT.size(1) > 0, "ForwardDecode: input_ids must be [batch, T > 0], got "
                                                                    << input_ids_BT.sizes());
  const int64_t start = cache.tokens, count = input_ids_BT.size(1);
  DF_CHECK(start + count <= cache.capacity, "generation: position " << start + count - 1 << " is beyond the cache's "
                                                                     << cache.capacity << " positions");
  // A generated sequence is one document: no document ids.
  auto slice = [&](const std::optional<RotaryTables>& t) {
    return t ? RotaryTables{t->cos_LD.narrow(0, start, count), t->sin_LD.narrow(0, start, count),
                            /*document_ids_BL=*/torch::Tensor()}
             : RotaryTables{};
  };
  const RotaryTables full = slice(cache.full), local = slice(cache.local);
  auto x = Embed(input_ids_BT);
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    x = layers_[i]->forward(x, config_.layer_types[i] == "sliding_attention" ? local : full, &cache.layers[i]);
  }
  cache.tokens += count;
  return Logits(norm(x));
}

torch::Tensor GemmaModelImpl::forward(const torch::Tensor& input_ids_BL) { return Logits(Hidden(input_ids_BL)); }

torch::Tensor GemmaModelImpl::Logits(const torch::Tensor& hidden_BLE) const {
  auto logits_BLV = torch::matmul(hidden_BLE, embed_tokens->weight.t());
  if (config_.final_logit_softcapping > 0) {
    const double cap = config_.final_logit_softcapping;
    logits_BLV = torch::tanh(logits_BLV / cap) * cap;
  }
  return logits_BLV;
}

torch::Tensor CausalLmLoss(const torch::Tensor& logits_BLV, const torch::Tensor& labels_BL) {
  const int64_t vocab = logits_BLV.size(-1);
  return torch::nn::functional::cross_entropy(
      logits_BLV.to(torch::kFloat32).reshape({-1, vocab}), labels_BL.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex));
}

torch::Tensor ShiftedLabels(const torch::Tensor& input_ids_BL) {
  auto labels = torch::full_like(input_ids_BL, kIgnoreIndex);
  const int64_t length = input_ids_BL.size(1);
  labels.narrow(1, 0, length - 1).copy_(input_ids_BL.narrow(1, 1, length - 1));
  return labels;
}

}  // namespace darkformer
