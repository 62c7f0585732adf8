// Causal positive-feature attention over all chunks at once: the form CUDA runs, with a number
// of ops (kernel launches) that does not grow with the sequence length L. The math is the
// per-feature stabiliser of per_feature_chunks.h (normaliser >= 1 at any scale), every chunk's
// three parts in batched products; in chunks of C positions (N = ceil(L / C), the last one
// zero-padded: padded keys come after every real query, so they reach nothing real):
//   * each chunk's own state U_c = sum_{j in c} exp(l_j - R(e_c)) [v_j, 1]^T relative to its last
//     position's per-feature max, all chunks in one batched product;
//   * the state entering chunk c, S(e_{c-1}) = sum_{c' < c} exp(R(e_c') - R(e_{c-1})) U_c' per
//     feature: one product with the per-feature N x N decays, or for rows of more than 64 chunks
//     the same sums in blocks of ~sqrt(N) chunks (chunk_decays.h: m N^2 against ~2 m N^1.5 per key
//     row; a sequential scan would cost ops per chunk, a log-depth scan log N of them);
//   * the sub-chunk parts and the reads, per_feature_chunks.h.
// The backward is closed-form in the same shape: queries against the same terms, keys and values
// against the reverse states (the transposed decays), R and s held constant (out is exactly
// invariant to them). Saved for the backward: x, y, v, the output and its normaliser, O(L D);
// the terms are recomputed.
#pragma once

#include <torch/torch.h>

#include "attention/ops/feature_map.h"

namespace darkformer {

// The sizes of a call: `batch` sequences of `length` positions, `heads` query heads on `rows` key
// rows (K, or H where keys are per query head), m `features`, values `value_dim` wide, `chunk`.
struct ChunkParallelDims {
  int64_t batch, length, heads, rows, features, value_dim, chunk;
};
// Bytes its backward holds at once beyond the inputs and outputs (fp32), its terms made for
// `slice_rows` key rows at a time (ChunkParallelSlice): per query position and head the sub-chunk's
// pairs (S m), the three parts' factors and their gradient (3 m), the part-2 scores and p (2 C)
// and h (2 (D+1)); per key position and row R, exp(l - R(e_c)) (2 m) and each key against the
// chunk's U = C / S references with its gradient's product (2 U m); per key row the per-feature
// decays between chunks (chunk_decays.h) and the states S, T, Z (3 N m (D+1)). The log-features
// and their gradients (2 m per query position and head, 2 m per key position and row) and d[v, 1]
// are made for the whole call. The memory estimate's shadow counts the same.
int64_t ChunkParallelWorkingBytes(const ChunkParallelDims& d, int64_t slice_rows);
// A slice's terms stay within this many bytes where one key row's do.
constexpr int64_t kChunkParallelSliceBytes = int64_t{1} << 30;
// Key rows per slice: whole sequences (a multiple of rows) where one fits in `budget`, as many as
// fit; else that many rows of one sequence, one at least; the slices as even as they can be. Rows
// never meet (each its own keys, its query heads, its sums), so a slice computes what the whole
// call would.
int64_t ChunkParallelSlice(const ChunkParallelDims& d, int64_t budget);

// x_BHLD, y_BKLD, v_BKLD in fp32 or fp64 (the caller converts, and excludes autocast) -> out_BHLD.
// document_ids_BL (document_mask.h), when defined: every sum stays inside a document, and the
// per-feature maxima restart at each document's first position (a boundary is a decay of -inf
// between chunks, a mask on every part inside one). The terms are made a slice of key rows at a
// time (ChunkParallelSlice, slice_bytes its budget), forward and backward.
torch::Tensor ChunkParallelCausalAttention(const torch::Tensor& x_BHLD, const torch::Tensor& y_BKLD,
                                           const torch::Tensor& v_BKLD, const FeatureMap& map, int64_t chunk_size,
                                           const torch::Tensor& document_ids_BL = {},
                                           int64_t slice_bytes = kChunkParallelSliceBytes);

// Bytes its autograd node holds for the backward; 0 when `out` was not produced by it.
int64_t ChunkParallelSavedBytes(const torch::Tensor& out);

}  // namespace darkformer
