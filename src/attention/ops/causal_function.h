// The causal operator's autograd function for the chunk loop and the raw CPU kernel, and the entry
// point that picks the form (FeatureMap::op; chunk_parallel.h is the third form). Every form runs
// the per-feature stabiliser (per_feature_chunks.h): normaliser >= 1 at any scale, no guard. The
// loop and raw forms: features are computed chunk by chunk from the D-wide inputs (never held for
// the whole sequence), the backward recomputes them per chunk in two scans (queries in forward
// order against the running state, keys in reverse order against the reverse state), and
// autograd saves only x, y, v, the kernel's parameters, the output and its normaliser.
// Positive features in fp32 on a CPU with AVX2 run a raw kernel instead of LibTorch ops
// (raw_cpu_kernel.h): its backward is one reverse scan, reading checkpoints of the state and its
// per-feature reference that its forward saves every ceil(m / S) sub-chunks (~Dv + 2 floats per
// position and key row).
// causal_linear_attention.h (the composite form) stays as the naive reference the tests use.
//
// Grouped / multi-query attention: x has H query heads, y and v have K key/value heads; key
// features and running state are computed once per KV head (F = 1), or once per query head
// (F = G = H / K) when the kernel's parameters differ per query head (darkformer per-head M).
//
// Threads: the batch folds into the heads, and key rows (KV heads of every sequence, or query
// heads when key features are per query head) are independent. On the CPU the operator splits
// them into blocks, at least one per intra-op thread and at most 8 query heads each (a chunk's
// features stay in a core's L2), and scans the blocks in parallel, each block's ops
// single-threaded and covering all its rows (a chunk's ops are too small to split between
// threads, and per-op overhead is what dominates at chunk scale). With fewer key rows than
// threads (multi-query, one sequence) a row's query heads are split into parts, each recomputing
// the row's key side and adding its share of dk, dv. On a GPU one block covers every row of the
// batch (each op one launch). The scans run under InferenceMode where nothing is recorded (the
// forward; the closed-form backward).
#pragma once

#include <torch/torch.h>

#include "attention/ops/feature_map.h"

namespace darkformer {

// out_BHLD[i] = sum_{j <= i} phi(x_i).phi(y_j) v_j / sum_{j <= i} phi(x_i).phi(y_j), in fp32 (fp64 for
// fp64 x): bf16 inputs are converted, and autocast is excluded inside, its backward included.
// op: cuda computes so too and returns it in bf16 where v is bf16 (cuda_op.h): callers convert the
// output to v's dtype.
// With document_ids_BL (document_mask.h) the sums run over j in i's own document: the
// chunk-parallel form masks inside its operator (op count independent of L and of the number of
// documents); the raw CPU kernel scans each document of a row alone inside one call (`auto` where
// it applies, else the chunk-parallel form); the chunk loop, asked for by name, runs once per
// document (PerDocument).
torch::Tensor FusedCausalLinearAttention(const torch::Tensor& x_BHLD, const torch::Tensor& y_BKLD,
                                         const torch::Tensor& v_BKLD, const FeatureMap& map, int64_t chunk_size,
                                         const torch::Tensor& document_ids_BL = {});

// Bytes the operator's autograd node holds for its backward (saved tensors), for the memory test
// and the benchmark; 0 when `out` was not produced by the operator with gradients on.
int64_t FusedCausalSavedBytes(const torch::Tensor& out);

}  // namespace darkformer
