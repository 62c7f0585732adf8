// The queries' side of the CUDA operator's scan (cuda_scan_body.h): their base-2 log-features, one
// sub-chunk at a time, into the block's scratch. Either given whole (computed outside by the map's
// own LibTorch ops: any map, and LFK, whose learned W needs d log phi itself), or projected here
// from the queries as given (positive features: a = x P with P = log2(e) A W^T per head for
// darkformer's map, log2(e) s W^T for a scale), so no L x m tensor of them exists in the forward
// or the backward. The backward then gives d x' = (d log phi) W at the mapped queries x' = x A (or
// s x) instead of d log phi: the query's own -|x'|^2 / 2, which the features drop (a shift of all
// of a query's arguments, s_t's included), has an exactly zero gradient (the output does not move
// when every a_ti moves by the same amount), so its term -x' sum_i (d log phi)_i is left out.
#pragma once

#include <cstdint>

#include "attention/ops/cuda_scan_bf16.h"
#include "attention/ops/cuda_scan_block.h"
#include "attention/ops/cuda_scan_matmul.h"

namespace darkformer::cuda_scan {

// One key row's G query heads.
struct Queries {
  // Given: base-2 log-features, head h at h * a_head_stride, L x m each.
  const float* a = nullptr;
  int64_t a_head_stride = 0;
  // Inside (a == nullptr): the queries as given, fp32 or bf16 (their bits), element (h, p, d) at
  // h * x_head + p * x_pos + d * x_dim, d < dim; the projection (dim x m, head h's at
  // h * proj_head_stride; 0: shared), and for the backward W (m x mapped_dim, shared).
  const void* x = nullptr;
  bool x_bf16 = false;
  int64_t x_head = 0, x_pos = 0, x_dim = 0, dim = 0;
  const float* proj = nullptr;
  int64_t proj_head_stride = 0;
  const float* w = nullptr;
  int64_t mapped_dim = 0;

  DF_HD bool Inside() const { return a == nullptr; }
  DF_HD float X(int64_t h, int64_t p, int64_t d) const {
    return LoadAsFloat(x, x_bf16, h * x_head + p * x_pos + d * x_dim);
  }
};

// The base-2 log-features of the G sl queries at pos into qa (G sl x m, head-major); on tensor
// cores in 3xTF32, as the keys' (cuda_scan_keys.h).
DF_HD inline void QueryFeatures(const Block& b, const Queries& q, bool tensor_cores, int64_t m, int64_t g,
                                int64_t pos, int64_t sl, float* qa) {
  if (!q.Inside()) {
    ParallelFor(b, g * sl * m, [&](int64_t idx) {
      const int64_t ht = idx / m, i = idx % m;
      qa[idx] = q.a[(ht / sl) * q.a_head_stride + (pos + ht % sl) * m + i];
    });
    return;
  }
  if (q.proj_head_stride == 0) {  // one projection: every head's queries in one product
    MatMul<Split::kTf32>(
        b, tensor_cores, g * sl, m, q.dim, [&](int64_t ht, int64_t d) { return q.X(ht / sl, pos + ht % sl, d); },
        [&](int64_t d, int64_t i) { return q.proj[d * m + i]; },
        [&](int64_t ht, int64_t i, float sum) { qa[ht * m + i] = sum; });
    return;
  }
  for (int64_t h = 0; h < g; ++h) {
    const float* proj = q.proj + h * q.proj_head_stride;
    MatMul<Split::kTf32>(
        b, tensor_cores, sl, m, q.dim, [&](int64_t t, int64_t d) { return q.X(h, pos + t, d); },
        [&](int64_t d, int64_t i) { return proj[d * m + i]; },
        [&](int64_t t, int64_t i, float sum) { qa[(h * sl + t) * m + i] = sum; });
  }
}

// The backward's query gradients of the G sl queries at pos from da (G sl x m, d log phi, natural
// log): given features, da itself into out (head h at h * out_head_stride, L x m each); inside,
// d x' = da W into out (L x mapped_dim each), on tensor cores in bf16x3 (cuda_scan_matmul.h).
DF_HD inline void QueryGradients(const Block& b, const Queries& q, bool tensor_cores, int64_t m, int64_t g,
                                 int64_t pos, int64_t sl, const float* da, float* out, int64_t out_head_stride) {
  if (!q.Inside()) {
    ParallelFor(b, g * sl * m, [&](int64_t idx) {
      const int64_t ht = idx / m, i = idx % m;
      out[(ht / sl) * out_head_stride + (pos + ht % sl) * m + i] = da[idx];
    });
    return;
  }
  const int64_t r = q.mapped_dim;
  MatMul<Split::kBf16>(
      b, tensor_cores, g * sl, r, m, [&](int64_t ht, int64_t i) { return da[ht * m + i]; },
      [&](int64_t i, int64_t k) { return q.w[i * r + k]; },
      [&](int64_t ht, int64_t k, float sum) { out[(ht / sl) * out_head_stride + (pos + ht % sl) * r + k] = sum; });
}

}  // namespace darkformer::cuda_scan
