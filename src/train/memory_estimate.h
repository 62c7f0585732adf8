// Memory of a training run per device, predicted from its run config: the model is built for its
// shapes alone (util/shapes_only.h: nothing is allocated) and asked. Weights, gradients, AdamW
// state, the activations autograd saves for the backward (with and without activation
// checkpointing), the logits / loss buffers, the backward's transients, and the peak, the largest
// sum of what is alive at one moment of a step.
//
// The activations come from a shadow of the model's forward, which each decoder layer and kernel
// gives beside its forward (ShadowForward): every op of RMSNorm, the q/k/v/o projections, RoPE,
// the attention kernel, the GeGLU MLP and the residuals is replayed on sizes only
// (util/shadow_tape.h), with the rules autograd uses to decide what a node saves (a product saves
// an operand only when the other one needs a gradient, a frozen Linear keeps no copy of its
// input, ...), under fp32 or bf16 autocast (Linear outputs bf16, weights cast per use,
// random-feature attention and the residual stream fp32). Checked against LibTorch's allocator on
// CPU runs of the trainer (tests/cuda/memory_estimate_test.cpp); docs/memory.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/run_config.h"

namespace darkformer {

struct MemoryEstimateOptions {
  int64_t devices = 1;  // data-parallel ranks sharing data.batch_size
  // Whether the run computes on a CPU: the fused random-feature operator's raw CPU kernel then
  // also saves checkpoints of its key state. Default: train.device == cpu.
  bool cpu = false;
};

// One moment of a step and the bytes alive then.
struct MemoryPhase {
  std::string name;
  int64_t bytes = 0;
};

struct MemoryEstimate {
  // The micro-batch one device runs forward and backward at once.
  int64_t micro_batch_rows = 0;   // data.batch_size / devices
  int64_t tokens_per_micro_batch = 0;
  int64_t tokens_per_step = 0;    // per device: grad_accum micro-batches
  int64_t parameters = 0, trainable_parameters = 0;
  int64_t weights = 0;            // fp32 parameters and buffers (the kernels' projections)
  int64_t gradients = 0;          // fp32, trainable parameters only
  int64_t optimizer = 0;          // AdamW: exp_avg and exp_avg_sq, fp32
  int64_t activations_full = 0;   // saved for the backward, every layer kept
  int64_t activations_checkpointed = 0;  // each layer's input only (+ one layer recomputed: transient)
  bool checkpointing = false;     // which of the two applies
  int64_t outside_layers = 0;     // saved outside the decoder layers (embedding side, final norm)
  int64_t loss_buffers = 0;       // full logits path: logits + log-softmax (+ grads); chunked: dW, dh, C x V blocks
  int64_t backward_transient = 0; // the largest extra of the backward over what is saved
  int64_t cublas_workspaces = 0;  // GPU only: cuBLAS's workspaces, kept by the allocator (cublas_workspace.h)
  int64_t peak = 0;               // max over phases
  std::string peak_phase;
  std::vector<MemoryPhase> phases;
  std::vector<std::string> notes;
};

MemoryEstimate EstimateTrainingMemory(const RunConfig& config, const MemoryEstimateOptions& options = {});

// "12.34 GiB (13,249,974,272 bytes)".
std::string FormatBytes(int64_t bytes);

}  // namespace darkformer
