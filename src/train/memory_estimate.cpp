// Training memory from a run config (see memory_estimate.h).
#include "train/memory_estimate.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/decoder_layer.h"
#include "model/gemma_model.h"
#include "train/cublas_workspace.h"
#include "train/trainable_set.h"
#include "util/error.h"
#include "util/shadow_tape.h"
#include "util/shapes_only.h"

namespace darkformer {

namespace {

using shadow::kBf16;
using shadow::kF32;
using shadow::Shadow;
using shadow::Tape;

struct LayerResult {
  Shadow out;
  int64_t gradients = 0;    // bytes of its trainable parameters' fp32 gradients
  int64_t saved = 0;        // bytes saved for the backward (the layer's input included when saved)
  int64_t saved_input = 0;  // of which the layer's input
  int64_t transient = 0;    // extra bytes of its backward (gradients of activations, casts)
  std::string note;         // its attention's (ShadowAttention::note)
};

// The run's model built for its shapes alone (util/shapes_only.h), its parameters trained and
// stored as the trainer's rules say (trainable_set.h).
GemmaModel ShapesOnlyModel(const RunConfig& config) {
  ShapesOnlyScope shapes_only;
  GemmaModel model(config.model, config.attention);
  FreezeByGlobs(*model, config.train.trainable);
  if (config.train.frozen_weights_bf16) StoreFrozenLinearWeightsInBf16(*model);
  return model;
}

// The decoder layers' shadows, each on its own tape, from the embedding's output `x`.
std::vector<LayerResult> ShadowLayers(const GemmaModelImpl& model, const ShadowAttentionCall& call, bool bf16, Shadow x) {
  const bool fused_norms = !call.cpu;
  std::vector<LayerResult> layers;
  for (const auto& module : *model.layers) {
    const auto& layer = *module->as<DecoderLayerImpl>();
    Tape tape(bf16, fused_norms);
    const Shadow in = tape.New(x.numel, x.esz, x.rg);  // the input keeps its identity in this tape
    const auto shadowed = layer.ShadowForward(tape, call, in);
    LayerResult result{shadowed.out, 0, tape.SavedBytes(), tape.IsSaved(in) ? in.bytes() : 0, shadowed.backward_bytes,
                       shadowed.note};
    for (const auto& p : layer.parameters()) result.gradients += p.requires_grad() ? kF32 * p.numel() : 0;
    layers.push_back(result);
    x = result.out;
  }
  return layers;
}

// The LM head's loss: what it saves, its forward's and backward's extra, and evaluation's peak.
struct LossBytes {
  int64_t saved = 0, forward = 0, backward = 0, buffers = 0, eval_peak = 0;
};

LossBytes LossMemory(const TrainConfig& t, int64_t T, int64_t E, int64_t V, bool embedding_trains, bool h_needs_grad) {
  const bool bf16 = t.precision == Precision::kBf16Autocast;
  const int64_t act = bf16 ? kBf16 : kF32;
  LossBytes l;
  const int64_t C = t.loss_chunk_tokens;
  if (C <= 0) {
    // logits = h W^T (autocast: bf16 casts of h and W saved), to fp32, log-softmax saved.
    if (bf16) {
      if (embedding_trains) l.saved += T * E * kBf16;
      if (h_needs_grad) l.saved += V * E * kBf16;
    }
    l.saved += T * V * kF32;                                  // log-softmax
    l.forward = T * V * act + (bf16 ? T * V * kF32 : 0);      // logits (and their fp32 copy)
    // nll's gradient, log-softmax's input gradient, its saved output; then the logits' gradient
    // in the GEMM's dtype with the head's dW.
    l.backward = std::max<int64_t>(2 * T * V * kF32 + (bf16 ? T * V * kBf16 : 0),
                                   T * V * act + (embedding_trains ? V * E * (bf16 ? kBf16 : 0) : 0) + T * E * kF32);
    l.buffers = l.saved + std::max(l.forward, l.backward);
    l.eval_peak = 2 * T * V * kF32 + (bf16 ? T * V * kBf16 : 0) + T * E * kF32;
    return l;
  }
  const int64_t c = std::min(C, T);
  if (h_needs_grad) l.saved += T * E * kF32;      // dh
  if (embedding_trains) l.saved += V * E * kF32;  // dW, made in the forward
  // Per chunk: z (GEMM dtype), l in fp32 (dz shares it in fp32; a bf16 copy under autocast),
  // dh's product, dW's product (V x E, the GEMM dtype) and autocast's per-use casts of W.
  l.forward = c * V * act + c * V * kF32 + (bf16 ? c * V * kBf16 : 0) + c * E * kF32 +
              (embedding_trains ? V * E * act : 0) + (bf16 ? V * E * kBf16 : 0);
  l.backward = 0;  // scales its saved gradients in place
  l.buffers = l.saved + l.forward;
  l.eval_peak = c * V * act + c * V * kF32 + T * E * kF32 + (bf16 ? V * E * kBf16 : 0);
  return l;
}

// The worst moment of the layers' backward, from the last layer down: the layers below still
// hold their activations, the gradients of the layer and those above exist (all of them after the
// first micro-batch: `carried`), and one layer's backward transient, plus its recomputation under
// checkpointing. `head_grads` arrive first (the LM head's dW, the final norm's); `fixed` is alive
// throughout (weights, AdamW state, what is saved outside the layers).
int64_t WorstLayerBackward(const std::vector<LayerResult>& layers, int64_t saved_layers, int64_t layer_input,
                           bool checkpointing, int64_t carried, int64_t head_grads, int64_t fixed) {
  int64_t worst = 0, below = saved_layers, grads_so_far = head_grads;
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
    below -= checkpointing ? layer_input : it->saved;
    grads_so_far += it->gradients;
    // Checkpointed: the kept input, the recomputation's saved tensors (sharing that input) and
    // the recomputed output.
    const int64_t live = checkpointing ? layer_input + it->saved - it->saved_input + layer_input : it->saved;
    worst = std::max(worst, fixed + below + live + std::max(carried, grads_so_far) + it->transient);
  }
  return worst;
}

std::vector<std::string> Notes(bool bf16, bool cpu, int64_t cublas_workspaces) {
  std::vector<std::string> notes;
  if (bf16) notes.push_back("bf16 autocast: Linear outputs and per-use weight casts are bf16 (2 bytes); "
                            "random-feature attention, norms and the residual stream fp32");
  if (cpu) notes.push_back("CPU: includes the fused operator's raw-kernel key-state checkpoints");
  if (!cpu) notes.push_back(fmt::format("GPU: includes {} cuBLAS workspaces of {:.0f} MiB (the forward's and autograd's threads)",
                                        kCublasHandlesInTraining, cublas_workspaces / kCublasHandlesInTraining / 1048576.0));
  notes.push_back("not counted: the CUDA context and the allocator's cache / fragmentation (add ~1-2 GiB on a GPU)");
  return notes;
}

}  // namespace

MemoryEstimate EstimateTrainingMemory(const RunConfig& config, const MemoryEstimateOptions& options) {
  DF_CHECK(options.devices > 0, "memory estimate: the number of devices must be positive, got " << options.devices);
  GemmaConfig m = config.model;
  m.Finalize();
  const auto& t = config.train;
  MemoryEstimate r;
  const int64_t B = MicroBatchRows(config.data, options.devices), L = config.data.seq_len, T = B * L;
  const int64_t E = m.hidden_size, V = m.vocab_size;
  const bool bf16 = t.precision == Precision::kBf16Autocast;
  r.micro_batch_rows = B;
  r.tokens_per_micro_batch = T;
  r.tokens_per_step = T * t.grad_accum;
  r.checkpointing = t.activation_checkpointing;

  // Parameters and buffers as the built model has them.
  const auto model = ShapesOnlyModel(config);
  for (const auto& p : model->parameters()) {
    r.parameters += p.numel();
    r.weights += p.numel() * static_cast<int64_t>(p.element_size());  // frozen_weights_bf16: 2 bytes
    if (!p.requires_grad()) continue;
    r.trainable_parameters += p.numel();
  }
  for (const auto& b : model->buffers()) r.weights += static_cast<int64_t>(b.nbytes());  // the kernels' draws
  r.gradients = kF32 * r.trainable_parameters;
  r.optimizer = 2 * kF32 * r.trainable_parameters;

  // Embedding side: lookup (saves the ids, which exist anyway), times sqrt(E): x0 in fp32.
  const Shadow emb = ShadowParameter(model->embed_tokens->weight);
  Shadow x{T * E, kF32, emb.rg, -1};
  ShadowAttentionCall call;
  call.batch = B;
  call.length = L;
  call.documents = config.data.document_masking;
  call.cpu = options.cpu;
  call.deterministic = config.train.deterministic;
  const auto layers = ShadowLayers(*model, call, bf16, x);
  if (!layers.empty()) x = layers.back().out;
  r.activations_checkpointed = m.num_hidden_layers * T * E * kF32;
  int64_t largest_layer = 0, largest_layer_transient = 0;
  for (const auto& l : layers) {
    r.activations_full += l.saved;
    largest_layer = std::max(largest_layer, l.saved);
    largest_layer_transient = std::max(largest_layer_transient, l.transient);
  }

  // Final norm (fp32 residual stream) and the loss.
  Tape head(bf16, /*fused_norms=*/!options.cpu);
  const Shadow xN = head.New(T * E, kF32, x.rg);
  const Shadow norm_weight = ShadowParameter(model->norm->weight);
  const Shadow hN = head.RmsNorm(xN, norm_weight, E);
  const int64_t norm_saved = head.SavedBytes();
  const int64_t small = 2 * T * 8 + 2 * L * m.head_dim * kF32;  // ids and labels, RoPE tables
  const auto loss = LossMemory(t, T, E, V, emb.rg, hN.rg);
  r.loss_buffers = loss.buffers;

  const int64_t base = r.weights + r.optimizer;  // AdamW's state exists from the first step on
  const bool accum = t.grad_accum > 1;           // micro-batches after the first start with all gradients
  const int64_t carried = accum ? r.gradients : 0;
  const int64_t outside = norm_saved + small;
  r.outside_layers = outside;
  const bool ckpt = t.activation_checkpointing;
  const int64_t saved_layers = ckpt ? r.activations_checkpointed : r.activations_full;
  const int64_t emb_grad = emb.rg ? V * E * kF32 : 0;
  const int64_t norm_grad = norm_weight.rg ? E * kF32 : 0;

  // On a GPU the cuBLAS workspaces are allocated at the first matmul and kept, so in every phase.
  r.cublas_workspaces = options.cpu ? 0 : kCublasHandlesInTraining * CublasWorkspaceBytes();
  auto add = [&](const std::string& name, int64_t bytes) { r.phases.push_back({name, bytes + r.cublas_workspaces}); };
  add("forward end + loss forward", base + carried + saved_layers + outside + loss.saved + loss.forward);
  add("loss backward", base + carried + saved_layers + outside + loss.saved + loss.backward);
  add("decoder layer backward (worst)",
      WorstLayerBackward(layers, saved_layers, T * E * kF32, ckpt, carried, emb_grad + norm_grad, base + outside));
  add("backward end (embedding's dense dW)", base + r.gradients + emb_grad + small);
  add("optimizer step (fused AdamW: in place)", base + r.gradients);
  add("evaluation (no grad; gradients kept)", base + r.gradients + loss.eval_peak + largest_layer_transient / 2);
  r.backward_transient = std::max(largest_layer_transient + (ckpt ? largest_layer + T * E * kF32 : 0), loss.backward);
  for (const auto& p : r.phases) {
    if (p.bytes > r.peak) {
      r.peak = p.bytes;
      r.peak_phase = p.name;
    }
  }
  r.notes = Notes(bf16, options.cpu, r.cublas_workspaces);
  for (const auto& layer : layers) {  // the layers' own, each once
    if (!layer.note.empty() && std::find(r.notes.begin(), r.notes.end(), layer.note) == r.notes.end()) {
      r.notes.push_back(layer.note);
    }
  }
  return r;
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
