// The per-feature stabiliser in chunks (docs/attention.md, "One stabiliser at full speed"): the
// chunk math the chunk-parallel form (all chunks at once) and the chunk loop (one chunk at a
// time) share, in LibTorch ops. Per key row, with a_t = log phi(x_t) (one query head),
// l_j = log phi(y_j), R_i(t) = max_{j <= t} l_ji (per feature, causal) and
// s_t = max_i (a_ti + R_i(t)):
//   n_t = sum_{j <= t} sum_i exp(a_ti + l_ji - s_t) [v_j, 1],   out_t = n_t[:D] / n_t[D] >= 1.
// For t in sub-chunk u (S positions) of chunk c (C positions; e' the previous chunk's last
// position, f_{u-1} the previous sub-chunk's), the keys split three ways, every factor <= 1:
//   1. before the chunk: exp(a_t + R(e') - s_t) . S(e'), the state S_i(e') = sum_{j <= e'}
//      exp(l_ji - R_i(e')) [v_j, 1] relative to each feature's own max (gated linear attention
//      with a vector gate: fla's chunk_gla);
//   2. earlier sub-chunks of the chunk: one product of exp(a_t + R(f_{u-1}) - s_t) and
//      exp(l_j - R(f_{u-1})), j < the sub-chunk's start: both <= 1 since l_j <= R(f_{u-1}) <= R(t);
//   3. the sub-chunk itself, j <= t: exp((a_ti + l_ji) - s_t) elementwise over the m features (no
//      common reference keeps both factors <= 1 there).
// The pair (i, j) attaining s_t contributes an exact 1 (its argument is computed as the same
// rounded sum s_t is the max of), so n_t[D] >= 1 at any input scale. Every reference is a prefix
// maximum: no output reads a later token, its rounding included. The backward holds R and s
// constant (out is exactly invariant to them).
//
// Layout: leading B R N (batch, key rows, chunks). The query side keeps each sub-chunk's G query
// heads together, ..U G S.. (Q = U G S rows of a chunk, in that order); the key side is ..C..
// (= ..U S..). V = D + 1. Internal to src/attention/ops.
#pragma once

#include <torch/torch.h>

#include "attention/ops/sub_chunk.h"

namespace darkformer::causal_ops {


// A block of chunks: what the math reads. doc_B1NC (document ids per position) undefined: one
// document per row.
struct ChunkBlock {
  int64_t group = 1, sub = 1;  // G, S
  torch::Tensor a_BRNUGSM;     // query log-features
  torch::Tensor l_BRNCM;       // key log-features
  torch::Tensor vh_BRNCV;      // [v, 1]
  torch::Tensor r_BRNCM;       // R(t), per document
  // R(e'), the entering state's reference; where no state enters (the first chunk) any finite
  // value <= R(t) (its first position's R): the state there is 0.
  torch::Tensor prev_BRNM;
  torch::Tensor doc_B1NC;
  torch::Tensor prevdoc_B1N;   // the document of e' (with doc_B1NC)
};

// What forward and backward compute from a block (no autograd).
struct ChunkTerms {
  torch::Tensor s_BRNUGS;      // query shifts
  torch::Tensor qc_BRNQM;      // exp(a_t + R(e') - s_t): part 1's query factors
  torch::Tensor ku_BRNUCM;     // exp(l_j - R(f_{u-1})) for j before sub-chunk u, else 0
  torch::Tensor qu_BRNUQM;     // exp(a_t + R(f_{u-1}) - s_t), t in sub-chunk u (G S rows)
  torch::Tensor scores_BRNUQC;  // part 2: qu ku^T
  torch::Tensor e_BRNUGSSM;    // part 3: exp(a_ti + l_ji - s_t), t, j in one sub-chunk, j <= t
  torch::Tensor w_BRNUGSS;     // part 3 summed over features
};
ChunkTerms BuildChunkTerms(const ChunkBlock& b);

// n_BRNQV of parts 2 and 3, plus part 1 against the entering states sin_BRNMV (undefined: none).
torch::Tensor ChunkNumerator(const ChunkBlock& b, const ChunkTerms& t, const torch::Tensor& sin_BRNMV);

// Keys against their chunk's last position e_c: exp(l_j - R(e_c)) (0 for another document's keys),
// and the chunk's own state contribution kend^T [v, 1] relative to R(e_c).
torch::Tensor KeysAtChunkEnd(const ChunkBlock& b);

// The backward given h_BRNQV = dL/dn. Queries: d a (BRNUGSM) from parts 1-3 (sin: the entering
// states) and T_BRNMV = sum_t qc_t h_t^T, the chunk's share of the later chunks' reverse states.
// Also kept for the keys' half: p = h [v, 1]^T of part 2 and part 3's share of d l.
struct QueryGrads {
  torch::Tensor da_BRNUGSM, t_BRNMV;
  torch::Tensor p_BRNUQC, dl_own_BRNCM;
};
// Consumes t.e_BRNUGSSM (scaled in place).
QueryGrads ChunkQueryBackward(const ChunkBlock& b, ChunkTerms& t, const torch::Tensor& h_BRNQV,
                              const torch::Tensor& sin_BRNMV);
// Keys and values: d l (BRNCM) and d[v, 1] (BRNCV) from parts 2-3 and, against the reverse states
// z_BRNMV = sum over later chunks' T relative to R(e_c) (undefined: none), part 1.
struct KeyGrads {
  torch::Tensor dl_BRNCM, dvh_BRNCV;
};
KeyGrads ChunkKeyBackward(const ChunkBlock& b, const ChunkTerms& t, const QueryGrads& q, const torch::Tensor& h_BRNQV,
                          const torch::Tensor& kend_BRNCM, const torch::Tensor& z_BRNMV);

// -inf where `crossing` is true, 0 elsewhere (a document boundary's decay).
torch::Tensor CrossingBias(const torch::Tensor& crossing, const torch::TensorOptions& options);

// R(t) = max_{j <= t} l_j per feature along dim 2 of l_BRLM, inside each document of
// doc_B1L (undefined: one per row). Exact: the maxima are keys' own values.
torch::Tensor PerFeaturePrefixMax(const torch::Tensor& l_BRLM, const torch::Tensor& doc_B1L);

}  // namespace darkformer::causal_ops
