// Forward FLOPs per token of one attention layer's kernel (q, k, v -> output), for the trainer's
// model FLOPs and MFU (train/model_flops.h). Multiply-adds count 2.
//   exact (PaLM appendix B convention, the full L x L square): 2 L D (q k^T) + 2 L D (weights v) per
//     query head;
//   log-form and signed feature kernels (the chunked causal form every one of our operators runs,
//     m = the feature dimension, V = D + 1, C = the chunk): per query head its features 2 D m, the
//     intra-chunk products 2 C (m + V) and the state read 2 m V; per key row (KV head, or query
//     head when the map is per head) its features 2 D m and the state update 2 m V;
//   random and constant baselines: the weighted sum of values, 2 L D per query head.
#pragma once

#include <cstdint>

#include "attention/attention_kernel.h"

namespace darkformer {

double AttentionForwardFlopsPerToken(const AttentionKernelImpl& kernel, int64_t heads, int64_t kv_heads,
                                     int64_t head_dim, int64_t length);

}  // namespace darkformer
