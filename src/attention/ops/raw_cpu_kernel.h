// The fused causal operator's CPU kernel for positive features (FeatureMap::positive_features,
// log phi = x W^T - |x|^2/2 - log(m)/2) on raw fp32 memory: one key row at a time (a key/value
// head and the G query heads that read it), with the per-feature stabiliser of
// per_feature_chunks.h scanned sub-chunk by sub-chunk: the running state S_i = sum_j
// 2^(l_ji - R_i) [v_j, 1] per feature (base 2), read by each sub-chunk's queries with
// 2^(a_t + R - s_t) <= 1, the sub-chunk's own pairs summed feature by feature, then folded in
// (rows whose max grew decay by 2^(R_old - R_new) <= 1). The normaliser is >= 1 at any scale.
// Features are computed a chunk (C positions) at a time, each product one BLAS call (cpu_gemm.h),
// each elementwise pass one loop (fast_exp2.h); the backward is one reverse scan (checkpoints
// below). Callers check the conditions (CPU, fp32, every per-head block L contiguous rows,
// Exp2LoopsVectorised()) and keep the LibTorch forms for everything else.
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

// The backward is one reverse scan over groups of sub-chunks. It needs the running state S
// (m x V, V = Dv + 1) and its per-feature reference R (m) before each group: the forward saves
// them as a checkpoint every CheckpointSubChunks(m, C) = ceil(m / S) sub-chunks (S = SubChunk(C, kMaxRawSubChunk)),
// i.e. ~V + 1 floats per position whatever m (O(L D), like x, y, v). Inside a group the backward
// refolds the states from the checkpoint, keeping each sub-chunk's entering state, and then runs
// the group's sub-chunks in reverse.
int64_t CheckpointSubChunks(int64_t features, int64_t chunk);
// Checkpoints of a row: one per group (the first, an empty state, included).
int64_t CheckpointCount(int64_t length, int64_t features, int64_t chunk);

// Forward outputs: out (G x L x Dv), the normaliser den (G x L, >= 1), and the checkpoints:
// states (count x m x V) and their references (count x m), what the backward reads.
struct PositiveRowForward {
  float* out;
  int64_t out_head_stride;
  float* den;
  int64_t den_head_stride;
  float* states;
  float* state_refs;
};
void RunPositiveRowForward(const PositiveRow& row, const PositiveRowForward& fwd);

// Backward: reads the forward's checkpoints, out, den and dL/dout (g); writes dx (G x L x D), dy
// (L x D) and dv (L x Dv); adds dL/dW into dw_MD (nullptr: W needs no gradient).
struct PositiveRowBackward {
  const float* states;
  const float* state_refs;
  const float* out;
  int64_t out_head_stride;
  const float* den;
  int64_t den_head_stride;
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
