// The fused causal operator's CPU kernel for positive features (FeatureMap::positive_features,
// log phi = x W^T - |x|^2/2 - log(m)/2) on raw fp32 memory: one key row at a time (a key/value
// head and the G query heads that read it), the whole sequence chunk by chunk, each product one
// BLAS call (cpu_gemm.h) and each elementwise pass one loop (fast_exp2.h). Same math, chunking and
// stabiliser as the LibTorch ops of fused_causal_attention.cpp (see the formulas there), without
// ~100 dispatched ops per chunk. Callers check the conditions (CPU, fp32, every per-head block L
// contiguous rows, Exp2LoopsVectorised()) and keep the LibTorch path for everything else.
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

// Forward outputs: out (G x L x Dv), the normaliser den (G x L) and r (L), the prefix max of the
// keys' log-scales b_j in base 2 (what the backward reads).
struct PositiveRowForward {
  float* out;
  int64_t out_head_stride;
  float* den;
  int64_t den_head_stride;
  float* r;
};
void RunPositiveRowForward(const PositiveRow& row, const PositiveRowForward& fwd);

// Backward: reads the forward's out, den, r and dL/dout (g); writes dx (G x L x D), dy (L x D)
// and dv (L x Dv); adds dL/dW into dw_MD (nullptr: W needs no gradient).
struct PositiveRowBackward {
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
