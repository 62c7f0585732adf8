// Training memory from a run config (see memory_estimate.h).
#include "train/memory_estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "attention/ops/raw_cpu_kernel.h"
#include "attention/kernel_registry.h"
#include "model/linear_weights.h"
#include "train/cublas_workspace.h"
#include "train/shadow_kernel.h"
#include "train/shadow_tape.h"
#include "train/trainable_set.h"
#include "util/error.h"

namespace darkformer {

namespace {

using shadow::ChunkParallel;
using shadow::DescribeKernel;
using shadow::KernelInfo;
using shadow::kBf16;
using shadow::kF32;
using shadow::Shadow;
using shadow::Tape;

struct LayerWeights {
  Shadow input_norm, post_attn_norm, pre_ff_norm, post_ff_norm, q_norm, k_norm;
  Shadow q, k, v, o, gate, up, down;
};

// Everything a layer's shadow needs.
struct ModelShape {
  int64_t E, H, K, D, I, V, layers;
  GemmaFamily family;
  double attn_softcap;
};

// The attention kernel's forward on the shadow (attention_kernel.h and the kernels' files).
Shadow KernelForward(Tape& tape, const KernelInfo& k, const ModelShape& s, int64_t B, int64_t L, const Shadow& q,
                     const Shadow& key, const Shadow& v, bool cpu) {
  const int64_t T = B * L;
  if (k.kind == KernelInfo::Kind::kExact) {
    // SDPA under the caller's autocast; k, v repeated to H heads for grouped / multi-query.
    const Shadow kr = s.K == s.H ? key : tape.New(T * s.H * s.D, key.esz, key.rg);
    const Shadow vr = s.K == s.H ? v : tape.New(T * s.H * s.D, v.esz, v.rg);
    const bool rg = q.rg || kr.rg || vr.rg;
    if (s.attn_softcap > 0) {  // explicit path: B H L L logits and weights
      const Shadow logits = tape.New(B * s.H * L * L, kF32, rg);
      const Shadow weights = tape.New(B * s.H * L * L, kF32, rg);
      if (rg) {
        tape.Save(tape.To(q, kF32));
        tape.Save(tape.To(kr, kF32));
        tape.Save(logits);
        tape.Save(weights);
        tape.Save(vr);
        if (tape.bf16()) tape.Save(tape.New(B * s.H * L * L, kBf16, true));
      }
      return tape.New(T * s.H * s.D, v.esz, rg);
    }
    const Shadow out = tape.New(T * s.H * s.D, q.esz, rg);
    if (rg) {
      tape.Save(q);
      tape.Save(kr);
      tape.Save(vr);
      tape.Save(out);
      tape.Save(tape.New(T * s.H, kF32, true));  // logsumexp
      if (k.documents && k.exact_mask) {  // exact's documents: mask (auto calls per document)
        // The block-diagonal mask (bool), and SDPA's additive copy of it in q's dtype, both saved.
        tape.Save(tape.New(B * L * L, 1, true));
        tape.Save(tape.New(B * L * L, q.esz, true));
      }
    }
    return out;
  }
  // Feature kernels: fp32 inside, autocast excluded (log_feature_kernel.cpp, signed_feature_kernel.cpp).
  const bool rg = q.rg || key.rg || v.rg || k.params_trainable;
  Shadow x, y, vf = tape.To(v, kF32);
  int64_t key_heads = s.K;  // heads of the operator's keys: K, or H with per-head parameters
  const int64_t width = k.kind == KernelInfo::Kind::kPositive && k.map_heads > 0 ? k.rank : s.D;
  if (k.kind == KernelInfo::Kind::kPositive && k.map_heads > 0) {
    // x = q (sqrt(s) M)^T as one product: q (or its contiguous copy) saved for M's gradient.
    const Shadow qf = tape.New(q.numel, kF32, q.rg);
    if (k.params_trainable) tape.Save(qf);
    x = tape.New(T * s.H * width, kF32, rg);
    Shadow yf = tape.To(key, kF32);
    if (k.map_heads > 1 && s.K < s.H) {
      key_heads = s.H;
      yf = tape.New(T * s.H * s.D, kF32, key.rg);
      vf = tape.New(T * s.H * s.D, kF32, v.rg);
    } else if (s.K > 1) {
      yf = tape.New(yf.numel, kF32, yf.rg);  // the product's contiguous copy of k's transposed layout
    }
    if (k.params_trainable) tape.Save(yf);
    y = tape.New(T * key_heads * width, kF32, rg);
    // The batched products broadcast (sqrt(s) M)^T to B x heads copies, saved for the inputs' gradients.
    if (qf.rg) tape.Save(tape.New(B * s.H * s.D * width, kF32, true));
    if (yf.rg) tape.Save(tape.New(B * key_heads * s.D * width, kF32, true));
  } else {
    x = tape.New(T * s.H * s.D, kF32, rg);  // q.to(f32) * sqrt(s): new, contiguous after folding
    y = tape.New(T * s.K * s.D, kF32, rg);
  }
  if (s.K > 1 && key_heads == s.K) vf = tape.New(vf.numel, kF32, vf.rg);  // folding copies v's layout
  const Shadow out = tape.New(T * s.H * s.D, kF32, rg);
  if (rg) {
    tape.Save(x);
    tape.Save(y);
    tape.Save(vf);
    tape.Save(out);
    tape.Save(tape.New(T * s.H, kF32, true));          // normaliser
    tape.Save(tape.New(T * key_heads, kF32, true));    // prefix max per key row
    if (cpu && k.kind == KernelInfo::Kind::kPositive) {  // the raw CPU kernel's key-state checkpoints
      const int64_t chunk = std::max<int64_t>(1, std::min(k.chunk, L));
      const int64_t count = CheckpointCount(L, k.features, chunk);
      tape.Save(tape.New(B * key_heads * count * (k.features * (s.D + 1) + 1), kF32, true));
    }
  }
  return tape.To(out, v.esz);
}

struct LayerResult {
  Shadow out;
  int64_t saved = 0;      // bytes saved for the backward (the layer's input included when saved)
  int64_t saved_input = 0;  // of which the layer's input
  int64_t transient = 0;  // extra bytes of its backward (gradients of activations, casts)
};

LayerResult DecoderLayerForward(const ModelShape& s, const LayerWeights& w, const KernelInfo& kernel, int64_t B,
                                int64_t L, const Shadow& x, bool bf16, bool cpu) {
  Tape tape(bf16);
  // The input keeps its identity in this tape (saved input counted here).
  const Shadow in = tape.New(x.numel, x.esz, x.rg);
  const int64_t T = B * L, E = s.E, HD = s.H * s.D, KD = s.K * s.D;
  const Shadow n1 = tape.RmsNorm(in, w.input_norm, E);
  Shadow q = tape.Linear(n1, w.q, E, HD), k = tape.Linear(n1, w.k, E, KD), v = tape.Linear(n1, w.v, E, KD);
  if (s.family == GemmaFamily::kGemma3) {
    q = tape.RmsNorm(q, w.q_norm, s.D);
    k = tape.RmsNorm(k, w.k_norm, s.D);
  }
  q = tape.Rope(q);
  k = tape.Rope(k);
  const Shadow att = KernelForward(tape, kernel, s, B, L, q, k, v, cpu);
  // out.to(x's dtype), transposed to B L H D: a copy.
  const Shadow merged = tape.Copy(tape.To(att, n1.esz));
  const Shadow o = tape.Linear(merged, w.o, HD, E);
  Shadow out;
  Shadow h;
  auto mlp = [&](const Shadow& m_in) {
    const Shadow g = tape.Linear(m_in, w.gate, E, s.I), u = tape.Linear(m_in, w.up, E, s.I);
    return tape.Linear(tape.Mul(tape.Gelu(g), u), w.down, s.I, E);
  };
  if (s.family == GemmaFamily::kGemma1) {
    h = tape.Add(in, o);
    out = tape.Add(h, mlp(tape.RmsNorm(h, w.post_attn_norm, E)));
  } else {
    h = tape.Add(in, tape.RmsNorm(o, w.post_attn_norm, E));
    out = tape.Add(h, tape.RmsNorm(mlp(tape.RmsNorm(h, w.pre_ff_norm, E)), w.post_ff_norm, E));
  }
  LayerResult r;
  r.out = {T * E, kF32, out.rg, -1};
  r.saved = tape.SavedBytes();
  r.saved_input = tape.IsSaved(in) ? in.bytes() : 0;
  // Backward: the gradients of the output and input (fp32), and the MLP's at its widest: the
  // gradients of gelu(g) * u's three T x I operands, plus a bf16 weight gradient before its
  // conversion to fp32.
  const int64_t act = bf16 ? kBf16 : kF32;
  const int64_t mlp_grads = 3 * T * s.I * act;
  int64_t attn_grads = (kernel.kind == KernelInfo::Kind::kExact ? 3 : 4) * T * HD * kF32;
  if (ChunkParallel(kernel, cpu)) {
    // Its backward holds whole-sequence features at once (ops/chunk_parallel.cpp): psi and dpsi per
    // query head; k~, exp(l - r_end) and dk~ per key row; the intra-chunk matrices P and A; h and
    // h scaled; the chunk states S, T, Z (N x m x (D+1) per key row).
    const int64_t m = kernel.features, C = std::max<int64_t>(1, std::min(kernel.chunk, L));
    const int64_t rows = kernel.map_heads > 1 ? s.H : s.K, chunks = (L + C - 1) / C;
    attn_grads = std::max(attn_grads, (2 * T * s.H * m + 3 * T * rows * m + 2 * T * s.H * C + 2 * T * s.H * (s.D + 1) +
                                       3 * B * rows * chunks * m * (s.D + 1)) * kF32);
  }
  const int64_t weight_cast = bf16 ? kBf16 * E * s.I : 0;
  r.transient = 2 * T * E * kF32 + std::max(mlp_grads, attn_grads) + weight_cast;
  return r;
}

}  // namespace

MemoryEstimate EstimateTrainingMemory(const RunConfig& config, const MemoryEstimateOptions& options) {
  DF_CHECK(options.devices > 0, "memory estimate: the number of devices must be positive, got " << options.devices);
  GemmaConfig m = config.model;
  m.Finalize();
  const auto& t = config.train;
  DF_CHECK(config.data.batch_size % options.devices == 0,
           "config key 'data.batch_size' (" << config.data.batch_size << ") does not split over " << options.devices
                                            << " devices: each takes batch_size / devices rows");
  MemoryEstimate r;
  const int64_t B = config.data.batch_size / options.devices, L = config.data.seq_len, T = B * L;
  const int64_t E = m.hidden_size, V = m.vocab_size;
  const bool bf16 = t.precision == Precision::kBf16Autocast;
  const int64_t act = bf16 ? kBf16 : kF32;
  r.micro_batch_rows = B;
  r.tokens_per_micro_batch = T;
  r.tokens_per_step = T * t.grad_accum;
  r.checkpointing = t.activation_checkpointing;

  // Parameters, trainable by the trainer's globs.
  std::map<std::string, Shadow> params;
  int64_t largest_trainable = 0;
  int64_t bf16_frozen = 0;  // train.frozen_weights_bf16: frozen *_proj.weight stored in 2 bytes
  for (const auto& p : ModelParameterSizes(m, config.attention)) {
    const bool train = MatchesAny(p.name, t.trainable);
    params[p.name] = Tape::Param(p.numel, train);
    const bool linear = IsLinearWeight(p.name);
    if (t.frozen_weights_bf16 && !train && linear) {
      params[p.name].esz = kBf16;
      bf16_frozen += p.numel;
    }
    r.parameters += p.numel;
    if (train) {
      r.trainable_parameters += p.numel;
      largest_trainable = std::max(largest_trainable, p.numel);
    }
  }
  DF_CHECK(r.trainable_parameters > 0, "config key 'train.trainable' matches no parameter");
  r.weights = kF32 * r.parameters - (kF32 - kBf16) * bf16_frozen + ModelBufferBytes(m, config.attention);
  r.gradients = kF32 * r.trainable_parameters;
  r.optimizer = 2 * kF32 * r.trainable_parameters;

  const ModelShape shape{E, m.num_attention_heads, m.num_key_value_heads, m.head_dim, m.intermediate_size, V,
                         m.num_hidden_layers, m.Family(), m.attn_logit_softcapping};
  // Embedding side: lookup (saves the ids, which exist anyway), times sqrt(E): x0 in fp32.
  const Shadow emb = params.at("embed_tokens.weight");
  Shadow x{T * E, kF32, emb.rg, -1};
  std::vector<LayerResult> layers;
  std::vector<int64_t> layer_grads;
  int64_t full = 0;
  for (int64_t i = 0; i < m.num_hidden_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    auto get = [&](const std::string& name) {
      const auto it = params.find(p + name);
      return it == params.end() ? Shadow{} : it->second;
    };
    LayerWeights w{get("input_layernorm.weight"), get("post_attention_layernorm.weight"),
                   get("pre_feedforward_layernorm.weight"), get("post_feedforward_layernorm.weight"),
                   get("self_attn.q_norm.weight"), get("self_attn.k_norm.weight"),
                   get("self_attn.q_proj.weight"), get("self_attn.k_proj.weight"), get("self_attn.v_proj.weight"),
                   get("self_attn.o_proj.weight"), get("mlp.gate_proj.weight"), get("mlp.up_proj.weight"),
                   get("mlp.down_proj.weight")};
    int64_t grads = 0;
    for (const auto& [name, s] : params) {
      if (s.rg && name.rfind(p, 0) == 0) grads += kF32 * s.numel;
    }
    layer_grads.push_back(grads);
    const auto kernel = DescribeKernel(config, i, t.trainable);
    auto layer = DecoderLayerForward(shape, w, kernel, B, L, x, bf16, options.cpu);
    full += layer.saved;
    layers.push_back(layer);
    x = layer.out;
  }
  r.activations_full = full;
  r.activations_checkpointed = m.num_hidden_layers * T * E * kF32;
  int64_t largest_layer = 0, largest_layer_transient = 0;
  for (const auto& l : layers) {
    largest_layer = std::max(largest_layer, l.saved);
    largest_layer_transient = std::max(largest_layer_transient, l.transient);
  }

  // Final norm (fp32 residual stream) and the loss.
  Tape head(bf16);
  const Shadow xN = head.New(T * E, kF32, x.rg);
  const Shadow hN = head.RmsNorm(xN, params.at("norm.weight"), E);
  const int64_t norm_saved = head.SavedBytes();
  const int64_t small = 2 * T * 8 + 2 * L * m.head_dim * kF32;  // ids and labels, RoPE tables
  int64_t loss_saved = 0, loss_forward = 0, loss_backward = 0, eval_peak = 0;
  const int64_t C = t.loss_chunk_tokens;
  if (C <= 0) {
    // logits = h W^T (autocast: bf16 casts of h and W saved), to fp32, log-softmax saved.
    if (bf16) {
      if (emb.rg) loss_saved += T * E * kBf16;
      if (hN.rg) loss_saved += V * E * kBf16;
    }
    loss_saved += T * V * kF32;                                  // log-softmax
    loss_forward = T * V * act + (bf16 ? T * V * kF32 : 0);      // logits (and their fp32 copy)
    // nll's gradient, log-softmax's input gradient, its saved output; then the logits' gradient
    // in the GEMM's dtype with the head's dW.
    loss_backward = std::max<int64_t>(2 * T * V * kF32 + (bf16 ? T * V * kBf16 : 0),
                                      T * V * act + (emb.rg ? V * E * (bf16 ? kBf16 : 0) : 0) + T * E * kF32);
    r.loss_buffers = loss_saved + std::max(loss_forward, loss_backward);
    eval_peak = 2 * T * V * kF32 + (bf16 ? T * V * kBf16 : 0) + T * E * kF32;
  } else {
    const int64_t c = std::min(C, T);
    if (hN.rg) loss_saved += T * E * kF32;  // dh
    if (emb.rg) loss_saved += V * E * kF32;  // dW, made in the forward
    // Per chunk: z (GEMM dtype), l in fp32 (dz shares it in fp32; a bf16 copy under autocast),
    // dh's product, dW's product (V x E, the GEMM dtype) and autocast's per-use casts of W.
    loss_forward = c * V * act + c * V * kF32 + (bf16 ? c * V * kBf16 : 0) + c * E * kF32 +
                   (emb.rg ? V * E * act : 0) + (bf16 ? V * E * kBf16 : 0);
    loss_backward = 0;  // scales its saved gradients in place
    r.loss_buffers = loss_saved + loss_forward;
    eval_peak = c * V * act + c * V * kF32 + T * E * kF32 + (bf16 ? V * E * kBf16 : 0);
  }

  const int64_t base = r.weights + r.optimizer;  // AdamW's state exists from the first step on
  const bool accum = t.grad_accum > 1;           // micro-batches after the first start with all gradients
  const int64_t carried = accum ? r.gradients : 0;
  const int64_t outside = norm_saved + small;
  r.outside_layers = outside;
  const bool ckpt = t.activation_checkpointing;
  const int64_t saved_layers = ckpt ? r.activations_checkpointed : r.activations_full;
  const int64_t emb_grad = emb.rg ? V * E * kF32 : 0;
  const int64_t norm_grad = params.at("norm.weight").rg ? E * kF32 : 0;

  // On a GPU the cuBLAS workspaces are allocated at the first matmul and kept, so in every phase.
  r.cublas_workspaces = options.cpu ? 0 : kCublasHandlesInTraining * CublasWorkspaceBytes();
  auto add = [&](const std::string& name, int64_t bytes) { r.phases.push_back({name, bytes + r.cublas_workspaces}); };
  add("forward end + loss forward", base + carried + saved_layers + outside + loss_saved + loss_forward);
  add("loss backward", base + carried + saved_layers + outside + loss_saved + loss_backward);
  // Layer i's backward, from the last: layers below i still hold their activations, gradients of
  // i and above exist, one layer's backward transient (and its recomputation under checkpointing).
  int64_t worst_layer = 0;
  {
    int64_t below = saved_layers;
    int64_t grads_so_far = emb_grad + norm_grad;  // the LM head's dW arrives first
    for (int64_t i = m.num_hidden_layers - 1; i >= 0; --i) {
      const int64_t own = ckpt ? T * E * kF32 : layers[i].saved;
      below -= own;
      grads_so_far += layer_grads[i];
      // Checkpointed: the kept input, the recomputation's saved tensors (sharing that input) and
      // the recomputed output.
      const int64_t live = ckpt ? T * E * kF32 + layers[i].saved - layers[i].saved_input + T * E * kF32
                                : layers[i].saved;
      const int64_t grads = accum ? std::max(r.gradients, grads_so_far) : grads_so_far;
      worst_layer = std::max(worst_layer, base + below + live + grads + layers[i].transient + outside);
    }
  }
  add("decoder layer backward (worst)", worst_layer);
  add("backward end (embedding's dense dW)", base + r.gradients + emb_grad + small);
  add("optimizer step (AdamW temporaries)", base + r.gradients + 2 * kF32 * largest_trainable);
  add("evaluation (no grad; gradients kept)", base + r.gradients + eval_peak + largest_layer_transient / 2);
  r.backward_transient = std::max(largest_layer_transient + (ckpt ? largest_layer + T * E * kF32 : 0), loss_backward);
  for (const auto& p : r.phases) {
    if (p.bytes > r.peak) {
      r.peak = p.bytes;
      r.peak_phase = p.name;
    }
  }
  if (bf16) r.notes.push_back("bf16 autocast: Linear outputs and per-use weight casts are bf16 (2 bytes); "
                              "random-feature attention, norms and the residual stream fp32");
  if (options.cpu) r.notes.push_back("CPU: includes the fused operator's raw-kernel key-state checkpoints");
  if (!options.cpu) r.notes.push_back(fmt::format("GPU: includes {} cuBLAS workspaces of {:.0f} MiB (the forward's and autograd's threads)",
                                                  kCublasHandlesInTraining, r.cublas_workspaces / kCublasHandlesInTraining / 1048576.0));
  r.notes.push_back("not counted: the CUDA context and the allocator's cache / fragmentation (add ~1-2 GiB on a GPU)");
  return r;
}

}  // namespace darkformer
