// The swappable inner part of attention: (q, k, v) -> output. The outer layer
// (model/attention_layer.h) owns projections, norms and RoPE; a kernel owns the score function,
// masking (causal, sliding window) and any parameters or random draws of its own.
//
// Shape legend: B batch, H query heads, L sequence length, D head dim, M random features.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "util/shadow_tape.h"

namespace darkformer {

// What the layer tells the kernel about one call.
struct AttentionCall {
  bool causal = true;           // position i attends to j <= i only
  int64_t sliding_window = 0;   // > 0: i attends to j with i - j < sliding_window (HF semantics)
  double softcap = 0.0;         // > 0: logits -> softcap * tanh(logits / softcap) (Gemma 2)
  double scale = 1.0;           // s: exact logits are s * q.k; feature kernels see x = sqrt(s) q, y = sqrt(s) k
  // Packed windows (data.document_masking): the document of every position, int64 B x L,
  // nondecreasing along a row (document_mask.h). Position i then attends to j only within its own
  // document; every running state starts empty at a document's first position. Undefined: each
  // row is one document.
  torch::Tensor document_ids_BL;
};

// Facts a kernel needs at construction.
struct KernelShape {
  int64_t num_heads = 1;      // query heads (k, v arrive with their own K KV heads, H % K == 0)
  int64_t head_dim = 1;
  int64_t layer_index = 0;    // for per-layer seeds and messages
  int64_t run_seed = 0;       // train.seed: offsets every draw, so the seeds of a sweep differ
};

// The seed of a kernel's draws: its option seed, per layer, per run (run_seed 0 keeps the
// option seed as configured).
inline int64_t KernelSeed(int64_t option_seed, const KernelShape& shape) {
  return option_seed + 1000 * shape.layer_index + 1000003 * shape.run_seed;
}

// One layer's decoding state, the kernel's own: a KV cache (exact), running sums (feature
// kernels), ... Created by the kernel's first Decode call.
struct DecodeState {
  virtual ~DecodeState() = default;
  // Bytes of the tensors it holds (what grows with the context, or does not).
  virtual int64_t Bytes() const = 0;
  int64_t tokens = 0;  // tokens appended so far (the next token's position)
};

// Bytes of a tensor that may be undefined.
inline int64_t NbytesOrZero(const torch::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

// One attention call's sizes, for the memory estimate's shadow forward (util/shadow_tape.h).
struct ShadowAttentionCall {
  int64_t batch = 1, length = 1, heads = 1, key_heads = 1, head_dim = 1;  // B L H K D
  double softcap = 0.0;
  bool documents = false;  // packed documents (data.document_masking)
  bool cpu = false;        // the run computes on a CPU (which form `op: auto` picks)
  bool deterministic = false;  // train.deterministic: the CUDA operator's dv per key row (cuda_scan::DvShared)
};

// A kernel's shadow output, and the bytes its backward holds at its widest beyond what it saved.
struct ShadowAttention {
  shadow::Shadow out;
  int64_t backward_bytes = 0;
  std::string note;  // what the estimate should tell of how the call runs (empty: nothing)
};

// A parameter as the shadow sees it: its size, stored element size and whether it trains.
inline shadow::Shadow ShadowParameter(const torch::Tensor& p) {
  if (!p.defined()) return {};
  return {p.numel(), static_cast<int64_t>(p.element_size()), p.requires_grad(), -1};
}

// SDPA's shadow: exact softmax attention, or any kernel that gives no shadow of its own (the
// baselines are counted as it). `saves_mask`: packed documents as one masked call.
ShadowAttention ShadowSdpa(shadow::Tape& tape, const ShadowAttentionCall& call, const shadow::Shadow& q,
                           const shadow::Shadow& k, const shadow::Shadow& v, bool saves_mask);

class AttentionKernelImpl : public torch::nn::Module {
 public:
  ~AttentionKernelImpl() override = default;
  // q_BHLD, k_BKLD, v_BKLD -> out_BHLD in v's dtype. k and v have K key/value heads, H a multiple
  // of K (grouped / multi-query attention: query head h reads KV head h / (H / K)).
  virtual torch::Tensor forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD,
                                const torch::Tensor& v_BKLD, const AttentionCall& call) = 0;
  // What callers use: forward(), with `call.document_ids_BL` honoured either by the kernel itself
  // (HandlesDocuments) or by one forward() per document, the results joined (document_mask.h).
  torch::Tensor Attend(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD,
                       const AttentionCall& call);
  // Whether forward() honours call.document_ids_BL itself (a mask, or state resets inside its
  // operator); false: Attend runs it once per document.
  virtual bool HandlesDocuments(const AttentionCall& /*call*/) const { return false; }
  // The name the registry built it under (kernel_registry.cpp writes each name once); "" for a
  // kernel constructed directly (a test's).
  const std::string& kernel_name() const { return kernel_name_; }
  void set_kernel_name(std::string name) { kernel_name_ = std::move(name); }
  // Whether the kernel honours AttentionCall::softcap / sliding_window (random-feature kernels
  // cannot; the model warns at build, naming the layers).
  virtual bool supports_softcap() const { return false; }
  virtual bool supports_sliding_window() const { return false; }
  // Whether the kernel's ops may run under autocast (exact softmax: SDPA in bf16, as HF runs it).
  // Every other kernel computes in fp32 (random features, their running sums and normaliser; the
  // baselines' weights): the layer excludes autocast around it and it converts q, k, v itself.
  virtual bool autocast_inside() const { return false; }
  // Generators the kernel draws from inside forward (the random baseline): a recomputation
  // (activation checkpointing) replays their state so it draws what the forward drew.
  virtual std::vector<at::Generator> forward_generators() const { return {}; }
  // Called by the trainer before each optimizer step with the steps done so far (0 before the
  // first). Redraw policies draw here, before the step that trains on the draw, so an evaluation, a
  // checkpoint or generation after step s reads the draw step s trained with (as a redraw at the
  // start of a training batch does in performer-pytorch or a Lightning callback).
  virtual void before_train_step(int64_t /*steps_done*/) {}
  // Data-aware initialisation: whether the kernel wants one batch of its layer's queries and keys
  // before training (e.g. darkformer `init: whitening`), and the call that hands them over, as the
  // kernel sees them in forward (after norms and RoPE, before the scale s; k repeated to H heads).
  virtual bool wants_calibration() const { return false; }
  // The largest log-feature of x = sqrt(s) q, for spike diagnostics; NaN for kernels without
  // features (exact, baselines).
  virtual double MaxLogFeature(const torch::Tensor& /*x_BHLD*/) const { return std::nan(""); }
  virtual void Calibrate(const torch::Tensor& /*q_BHLD*/, const torch::Tensor& /*k_BHLD*/, double /*scale*/) {}

  // Incremental causal attention for generation: appends T new tokens (q_BHTD, k_BKTD, v_BKTD,
  // at positions state->tokens ...) to `state` (null: a fresh one is made) and returns out_BHTD,
  // each new token attending to every earlier token and itself as forward() would over the whole
  // sequence. A prompt goes in as one call (the parallel path), then one token per call.
  virtual torch::Tensor Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD,
                               const torch::Tensor& k_BKTD, const torch::Tensor& v_BKTD, const AttentionCall& call);

  // What forward() saves for the backward, replayed on sizes (the memory estimate): records the
  // saved tensors on `tape` and returns the output (B L H D, in the element size forward returns).
  // Its parameters' requires_grad says whether they train. Default: SDPA's, unmasked.
  virtual ShadowAttention ShadowForward(shadow::Tape& tape, const ShadowAttentionCall& call, const shadow::Shadow& q,
                                        const shadow::Shadow& k, const shadow::Shadow& v) const {
    return ShadowSdpa(tape, call, q, k, v, /*saves_mask=*/false);
  }

 private:
  std::string kernel_name_;
};

TORCH_MODULE(AttentionKernel);

// KV heads repeated to `heads` query heads (each query head gets its group's KV head).
inline torch::Tensor RepeatKvHeads(const torch::Tensor& t_BKLD, int64_t heads) {
  const int64_t kv_heads = t_BKLD.size(1);
  return kv_heads == heads ? t_BKLD : t_BKLD.repeat_interleave(heads / kv_heads, /*dim=*/1);
}

}  // namespace darkformer
