// Cross-entropy through the LM head without the full logits: rows of hidden states go through
// logits = softcap(h W^T), log-softmax and the loss a chunk at a time, and (when gradients are
// wanted) the chunk's gradients w.r.t. h and W are computed right there, in the forward, as fla's
// fused linear cross-entropy does: no chunk's logits outlive it. At Gemma's 256k vocabulary the
// B x L x V fp32 logits are 16.8 GB at 8 x 2048 tokens; a chunk of C rows holds a few C x V.
//
// Shape legend: N rows (tokens), E hidden size, V vocabulary, C rows per chunk.
#pragma once

#include <torch/torch.h>

namespace darkformer {

struct LinearCrossEntropyOptions {
  int64_t chunk_rows = 1024;  // rows per chunk
  double softcap = 0.0;       // > 0: logits -> softcap * tanh(logits / softcap) (Gemma 2's final cap)
};

// The summed cross-entropy (fp32 scalar) of rows whose label is not kIgnoreIndex, differentiable
// w.r.t. hidden_NE and weight_VE. Equal to cross_entropy(softcap(hidden W^T), labels, sum) of the
// full logits; under autocast the head's products run in the autocast dtype as that one's do, and
// log-softmax in fp32.
torch::Tensor LinearCrossEntropySum(const torch::Tensor& hidden_NE, const torch::Tensor& weight_VE,
                                    const torch::Tensor& labels_N, const LinearCrossEntropyOptions& options);

// Evaluation without gradients, chunk by chunk: {summed loss, correct argmax predictions, labelled
// rows} as 3 fp64 values on the inputs' device, added chunk after chunk there (the host reads them
// when it needs them, not once per chunk).
torch::Tensor LinearCrossEntropyEval(const torch::Tensor& hidden_NE, const torch::Tensor& weight_VE,
                                     const torch::Tensor& labels_N, const LinearCrossEntropyOptions& options);

}  // namespace darkformer
