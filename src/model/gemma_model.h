// The decoder-only Gemma language model: scaled token embedding, decoder blocks, final RMSNorm
// and an LM head tied to the embedding (with Gemma 2's final-logit soft-cap).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "attention/attention_config.h"
#include "model/decoder_layer.h"
#include "model/gemma_config.h"

namespace darkformer {

// Generation state of the whole model: each layer's kernel state and the RoPE tables for every
// position up to `capacity` (built once, sliced per step).
struct DecodeCache {
  std::vector<std::unique_ptr<DecodeState>> layers;
  int64_t tokens = 0;  // tokens consumed so far
  int64_t capacity = 0;
  std::optional<RotaryTables> full, local;
  // Bytes of the layers' states (the RoPE tables excluded: fixed by capacity).
  int64_t StateBytes() const {
    int64_t bytes = 0;
    for (const auto& layer : layers) bytes += layer ? layer->Bytes() : 0;
    return bytes;
  }
};

// Packed windows of several documents (data.document_masking, data.document_positions): a
// position after `separator_id` (EOS) starts a new document, which attention cannot see past
// (document_mask.h); RoPE positions continue across the window or restart per document.
struct DocumentMasking {
  int64_t separator_id = -1;       // -1: off (each row is one document)
  bool restart_positions = false;  // RoPE position = the index inside the document
  bool enabled() const { return separator_id >= 0; }
};

class GemmaModelImpl : public torch::nn::Module {
 public:
  explicit GemmaModelImpl(GemmaConfig config, AttentionConfig attention = {});

  // input_ids_BL (int64) -> logits_BLV in the parameters' dtype.
  torch::Tensor forward(const torch::Tensor& input_ids_BL);
  // Final hidden states before the LM head.
  torch::Tensor Hidden(const torch::Tensor& input_ids_BL);
  // The summed next-token cross-entropy of labels_BL (kIgnoreIndex ignored) through the tied LM
  // head chunk_tokens tokens at a time (linear_cross_entropy.h): the logits never exist in full.
  torch::Tensor LossSum(const torch::Tensor& input_ids_BL, const torch::Tensor& labels_BL, int64_t chunk_tokens);
  // The same for evaluation, with next-token accuracy: {loss sum, correct, labelled tokens}, 3 fp64
  // values on the model's device (LinearCrossEntropyEval).
  torch::Tensor EvalChunked(const torch::Tensor& input_ids_BL, const torch::Tensor& labels_BL, int64_t chunk_tokens);
  // Documents in every forward from here on (training, evaluation, calibration); generation keeps
  // one document per prompt.
  void SetDocumentMasking(const DocumentMasking& documents) { documents_ = documents; }
  const DocumentMasking& document_masking() const { return documents_; }
  // Activation checkpointing per decoder layer (checkpointed_layer.h) while gradients are on.
  void SetActivationCheckpointing(bool on) { checkpoint_layers_ = on; }
  bool activation_checkpointing() const { return checkpoint_layers_; }

  // Generation: a cache for up to `capacity` tokens in all (at most max_position_embeddings),
  // then logits_BTV of T new tokens given everything the cache holds (a prompt, then one token
  // at a time). Equal to forward() over the whole sequence, position by position.
  DecodeCache NewDecodeCache(int64_t capacity, const torch::Device& device) const;
  torch::Tensor ForwardDecode(const torch::Tensor& input_ids_BT, DecodeCache& cache);
  // One layer's attention input: the residual stream after input_layernorm, and the layer's RoPE
  // tables. attention.QueriesKeys(h_BLE, rope) gives q and k as the kernel sees them.
  struct AttentionInput {
    int64_t layer;
    AttentionLayerImpl& attention;
    const torch::Tensor& h_BLE;
    const RotaryTables& rope;
  };
  using AttentionInputFn = std::function<void(const AttentionInput&)>;
  // Runs input_ids_BL through the decoder layers, handing `fn` each layer's attention input
  // before that layer runs: a kernel fn changes (calibrates) is in effect for its own layer's
  // output and so for every later layer's input. The one walk that calibration, spike statistics
  // and kernel-check share.
  void ForEachAttentionInput(const torch::Tensor& input_ids_BL, const AttentionInputFn& fn);
  RotaryTables RopeFor(int64_t layer, int64_t length, const torch::Device& device) const;
  // RopeFor the positions of input_ids_BL, with its documents when masking is on.
  RotaryTables RopeFor(int64_t layer, const torch::Tensor& input_ids_BL) const;

  // Swaps every layer's attention kernel for those the config names; other parameters untouched.
  void SetAttention(const AttentionConfig& attention);
  // HF-style init for training from scratch: normal(0, std) for linear and embedding weights,
  // zeros for norms (so (1 + w) = 1). Kernel parameters keep their own initialisation.
  void InitializeWeights(double std, uint64_t seed);

  const GemmaConfig& config() const { return config_; }
  const AttentionConfig& attention_config() const { return attention_; }
  AttentionLayer attention_layer(int64_t layer) { return layers_[layer]->self_attn; }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RmsNorm norm{nullptr};

 private:
  torch::Tensor Embed(const torch::Tensor& input_ids_BL);
  // The tied LM head, with Gemma 2's final soft-cap.
  torch::Tensor Logits(const torch::Tensor& hidden_BLE) const;
  AttentionKernel BuildKernel(int64_t layer) const;
  void WarnUnsupportedFeatures() const;

  GemmaConfig config_;
  AttentionConfig attention_;
  std::vector<DecoderLayer> layers_;
  bool checkpoint_layers_ = false;
  DocumentMasking documents_;
};
TORCH_MODULE(GemmaModel);

// Mean next-token cross-entropy in fp32; labels_BL are already aligned with positions
// (labels[t] is the target for position t), kIgnoreIndex (-100) is ignored.
torch::Tensor CausalLmLoss(const torch::Tensor& logits_BLV, const torch::Tensor& labels_BL);
// labels for plain next-token prediction on input_ids: shift left by one, kIgnoreIndex at the end.
torch::Tensor ShiftedLabels(const torch::Tensor& input_ids_BL);

}  // namespace darkformer
