// The fused causal operator's CPU kernel for positive features (FeatureMap::positive_features,
// log phi = x W^T - |x|^2/2 - log(m)/2) on raw fp32 memory: one key row at a time (a key/value
// head and the G query heads that read it), the whole sequence chunk by chunk, each product one
// BLAS call (cpu_gemm.h) and each elementwise pass one loop (fast_exp2.h). Same math, chunking and
// stabiliser as the LibTorch ops of ops/chunk_loop.cpp (see the formulas there), without
// ~100 dispatched ops per chunk, and a backward in one scan instead of two (checkpoints below).
// Callers check the conditions (CPU, fp32, every per-head block L contiguous rows,
// Exp2LoopsVectorised()) and keep the LibTorch path for everything else.
#pragma once

#include <cstdint>

namespace darkformer {

// One key row's inputs. Per-head blocks are L rows of contiguous floats; heads `*_head_stride`
// floats apart.
struct PositiveRow {
  int64_t length, dim, value_dim, features, group, chunk;  // L, D, Dv, m, G, C
  const float* w_MD;   // W, m x D
  const float* w2_DM;  // W^T log2(e), D x m: the features are computed in base 2
  const float* x;      // the G query heads, L x D each
  int64_t x_head_stride;
  const float* y;  // keys, L x D
  const float* v;  // values, L x Dv
};

// The backward is one reverse scan over groups of chunks. It needs the running key state S
// (m x V, V = Dv + 1) before each group: the forward saves it as a checkpoint every
// CheckpointChunks(m, C) = ceil(m / C) chunks, i.e. ~V floats per position whatever m (O(L D),
// like x, y, v). Inside a group the backward refolds the states from the checkpoint, keeping
// the group's key features, and then runs the group's chunks in reverse.
int64_t CheckpointChunks(int64_t features, int64_t chunk);
// Checkpoints of a row: one per group of CheckpointChunks chunks (the first, an empty state,
// included).
int64_t CheckpointCount(int64_t length, int64_t features, int64_t chunk);

// Forward outputs: out (G x L x Dv), the normaliser den (G x L), r (L), the prefix max of the
// keys' log-scales b_j in base 2, and the checkpoints: states (count x m x V) and their
// references (count), what the backward reads.
struct PositiveRowForward {
  float* out;
  int64_t out_head_stride;
  float* den;
  int64_t den_head_stride;
  float* r;
  float* states;
  float* state_refs;
};
void RunPositiveRowForward(const PositiveRow& row, const PositiveRowForward& fwd);

// Backward: reads the forward's checkpoints, out, den, r and dL/dout (g); writes dx (G x L x D), dy (L x D)
// and dv (L x Dv); adds dL/dW into dw_MD (nullptr: W needs no gradient).
struct PositiveRowBackward {
  const float* states;
  const float* state_refs;
  const float* out;
  int64_t out_head_stride;
  const float* den;
  int64_t den_head_stride;
  const float* r;
  const float* g;
  int64_t g_head_stride;
  float* dx;
  int64_t dx_head_stride;
  float* dy;
  float* dv;
  float* dw_MD;
};
void RunPositiveRowBackward(const PositiveRow& row, const PositiveRowBackward& bwd);

// Rows run through the two functions above since the program started (tests: the kernel is used
// where it applies, and only there).
int64_t PositiveRowKernelRuns();

}  // namespace darkformer
