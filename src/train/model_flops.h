// Model FLOPs per trained token, for the step line's MFU (multiply-adds count 2):
//   forward 2 N + attention, backward 2 N (activation gradients) + 2 N_trainable (weight
//   gradients) + 2 x attention,
// N the matmul weights (q, k, v, o, the MLP's three, the tied head: the embedding's lookup is not
// a matmul), attention the kernels' own forward count (attention/attention_flops.h) at the run's
// sequence length. With every weight trainable this is the usual 6 N + 3 x attention (PaLM,
// torchtitan); q/k/v-only finetuning computes no weight gradient for the frozen ones, and its MFU
// counts only the work done. Recomputation (activation checkpointing) is not model FLOPs.
#pragma once

#include <cstdint>

#include "model/gemma_model.h"

namespace darkformer {

struct ModelFlops {
  double per_token = 0;                  // the total above
  int64_t matmul_weights = 0;            // N
  int64_t trainable_matmul_weights = 0;  // N_trainable
  double attention_forward_per_token = 0;  // summed over the layers
};

ModelFlops CountModelFlops(GemmaModelImpl& model, int64_t seq_len);

// Peak FLOP/s for MFU: train.peak_tflops when set (> 0); else a known GPU's dense bf16 peak by
// its name (H100 / H200: 989 TFLOP/s, A100: 312); else 0 (no MFU: a CPU's peak is not known).
double PeakFlops(double configured_tflops, const std::string& device_name);

}  // namespace darkformer
