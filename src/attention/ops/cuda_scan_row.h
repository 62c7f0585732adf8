// The CUDA operator's scan (cuda_scan_body.h): what a key row's blocks read and write. A Row (its
// queries, keys and values as given, its cut into chunks and sub-chunks), the forward's outputs
// and the backward's inputs and gradients at their strides, and a block's scratch, carved from one
// buffer (shared memory where it fits: cuda_scan.cu).
#pragma once

#include <cstdint>

#include "attention/ops/cuda_scan_block.h"
#include "attention/ops/cuda_scan_keys.h"
#include "attention/ops/cuda_scan_queries.h"

namespace darkformer::cuda_scan {

DF_HD inline float Max(float a, float b) { return a < b ? b : a; }
constexpr float kNegInf = -__builtin_huge_valf();

// One key row: its G query heads (cuda_scan_queries.h), its keys (cuda_scan_keys.h) and values
// (L x Dv as given, fp32 or bf16: element (p, k) at p * v_pos + k * v_dim).
// Outputs and the backward's inputs per head at their head strides, L rows each.
struct Row {
  int64_t length, features, value_dim, group, sub, group_subs;  // L, m, Dv, G, S, sub-chunks per checkpoint
  Queries queries;
  Keys keys;
  const void* v;
  bool v_bf16;
  int64_t v_pos, v_dim;
  const int64_t* ids;  // the row's document ids (L); nullptr: one document
  bool tensor_cores;   // the matrix products on tensor cores, operands split (cuda_scan_matmul.h)
  bool factor_pairs;   // a sub-chunk's own pairs as products where they factor (FactoredQueries)

  // Whether a document starts at position p > 0 (p = 0 starts the row, which `has` covers).
  DF_HD bool StartsAt(int64_t p) const { return ids != nullptr && p > 0 && ids[p] != ids[p - 1]; }
};

struct ForwardOut {
  float* out;  // G x L x Dv, fp32; nullptr where out16 is given
  uint16_t* out16;  // the same in bf16 (FloatToBf16) instead, where the caller asked; else nullptr
  int64_t out_head_stride;
  float* den;  // G x L, >= 1
  int64_t den_head_stride;
  // The segment's checkpoints (chunks [first, first + span) of the row; Launch::Segment), slot j
  // chunk first + j's, then the next segment's: span + 1 x m x V, the state before sub-chunks
  // first group_subs, (first + 1) group_subs, ...; span + 1 x m; span: 1 where the chunk holds a
  // document start, else 0.
  float* states;
  float* refs;
  float* resets;
  int64_t first, span;
  // Whether the state after the segment's last chunk is made, in the last slot: where a chunk
  // follows it, and for a prefill (Launch::through_row_end) the state after the whole row.
  bool passes;
  // The state entering the segment (m x V, m; nullptr: the row's first, S_0 = 0 at reference -inf),
  // and where the one after it is copied once made (nullptr: nowhere). They may be the same memory:
  // the copy follows the barrier after the last read.
  const float* enter_state;
  const float* enter_ref;
  float* leave_state;
  float* leave_ref;
};

struct BackwardIo {
  float* states;  // the query side folds each chunk's in place
  const float* refs;
  const float* den;
  int64_t den_head_stride;
  float* dot;  // G x L at den_head_stride: g_t . out_t, the query side's (Cotangents) for the key side
  const void* g;  // dL/dout, G x L x Dv as given, fp32 or bf16 (g_bf16): (h, p, k) at the strides
  bool g_bf16;
  int64_t g_head_stride, g_pos, g_dim;
  float* dq;  // QueryGradients: d log phi (natural log, G x L x m), or d x' (G x L x R) inside
  int64_t dq_head_stride;
  float* dl;  // L x m
  float* dv;  // L x Dv
  // dv is the value row's, shared by its key rows (Launch::dv_shared): each adds its terms (AddShared)
  // to the zeros it starts as; else the row's own.
  bool dv_shared;
  const float* resets;  // the segment's checkpoints: the forward's step 1 wrote them (the backward reruns it)
  // span x group_subs x m: each sub-chunk's entering reference (the query side writes them)
  float* sub_refs;
  int64_t first, span;  // the segment's chunks, as ForwardOut's (states, refs and resets are its)
  // m x (Dv + 1): Z at the segment's end from the later segment, which ReverseStates replaces by Z
  // at its start for the segment before (nullptr where the row is one segment).
  float* z_carry;
};

DF_HD inline int64_t CheckpointCount(int64_t length, int64_t sub, int64_t group_subs) {
  const int64_t subs = (length + sub - 1) / sub;
  return (subs + group_subs - 1) / group_subs;
}

// A row's working memory, carved from one buffer of ScratchFloats floats.
struct Scratch {
  // qa: the sub-chunk's query features (QueryFeatures, head-major, G S x m); ka: its keys' where
  // the scan projects them (ProjectKeys, S x m; else unused). starts: per query of
  // the sub-chunk, its document's first position there (-1: before it). The state a block folds
  // into lives outside: in the call's per-chunk buffer (forward) or in group_states (backward).
  float *qa, *ka, *rrows, *s2, *w, *pw, *n, *kk, *decay, *vh, *starts;
  // The backward's: the query side's current sub-chunk's entering reference; h_t; da. The states
  // it folds live in the call's per-chunk buffers (cuda_scan_backward_body.h).
  float *group_ref = nullptr, *h = nullptr, *da = nullptr;

  // Forward-only (one block per chunk), or with the backward's buffers too (one block per row).
  DF_HD static int64_t Floats(int64_t m, int64_t dv, int64_t g, int64_t s, bool backward) {
    const int64_t v = dv + 1, gs = g * s;
    const int64_t forward = gs * m + 2 * s * m + gs + 2 * gs * s + gs * v + s * m + m + s * v + s;
    return forward + (backward ? m + gs * v + gs * m : 0);
  }
  DF_HD static Scratch Carve(float* p, int64_t m, int64_t dv, int64_t g, int64_t s, bool backward) {
    const int64_t v = dv + 1, gs = g * s;
    Scratch c;
    auto take = [&p](int64_t n) {
      float* q = p;
      p += n;
      return q;
    };
    c.qa = take(gs * m);
    c.ka = take(s * m);
    c.rrows = take(s * m);
    c.s2 = take(gs);
    c.w = take(gs * s);
    c.pw = take(gs * s);
    c.n = take(gs * v);
    c.kk = take(s * m);
    c.decay = take(m);
    c.vh = take(s * v);
    c.starts = take(s);
    if (!backward) return c;
    c.group_ref = take(m);
    c.h = take(gs * v);
    c.da = take(gs * m);
    return c;
  }
};

}  // namespace darkformer::cuda_scan
