// The keys' side of the CUDA operator's scan (cuda_scan_body.h): their base-2 log-features, one
// sub-chunk at a time. Either given whole (computed outside by the map's own LibTorch ops: any
// map but the positive ones, fp16 keys, a prefill's keys with nothing dropped), or projected here
// from the keys as given, so no L x m tensor of them exists in the forward or the backward:
// l_j = y_j P - n_j with the queries' projection P (log2(e) A W^T per head for darkformer's map,
// log2(e) s W^T for a scale) and n_j = log2(e) |y'_j|^2 / 2 at the mapped key y' (one float per
// key, computed outside: the key's own term, which does not cancel as the query's does). The
// backward's d log phi of the keys is the scan's output either way.
#pragma once

#include <cstdint>

#include "attention/ops/cuda_scan_bf16.h"
#include "attention/ops/cuda_scan_block.h"
#include "attention/ops/cuda_scan_matmul.h"

namespace darkformer::cuda_scan {

// One key row's keys.
struct Keys {
  // Given: base-2 log-features, L x m.
  const float* l = nullptr;
  // Inside (l == nullptr): the keys as given, fp32 or bf16 (their bits), element (p, d) at
  // p * y_pos + d * y_dim, d < dim; the row's projection (dim x m) and n (L floats).
  const void* y = nullptr;
  bool y_bf16 = false;
  int64_t y_pos = 0, y_dim = 0, dim = 0;
  const float* proj = nullptr;
  const float* norms = nullptr;

  DF_HD bool Inside() const { return l == nullptr; }
};

// Projects the sl keys at pos into ka (sl x m) where they are computed inside; given ones are read
// where they lie (KeysAt). On tensor cores in 3xTF32: the product feeds the features' exponents.
DF_HD inline void ProjectKeys(const Block& b, const Keys& k, bool tensor_cores, int64_t m, int64_t pos, int64_t sl,
                              float* ka) {
  if (!k.Inside()) return;
  MatMul<Split::kTf32>(
      b, tensor_cores, sl, m, k.dim,
      [&](int64_t j, int64_t d) { return LoadAsFloat(k.y, k.y_bf16, (pos + j) * k.y_pos + d * k.y_dim); },
      [&](int64_t d, int64_t i) { return k.proj[d * m + i]; },
      [&](int64_t j, int64_t i, float sum) { ka[j * m + i] = sum - k.norms[pos + j]; });
}

// The log-features of the sub-chunk at pos (sl x m): given ones in place, else ka, which
// ProjectKeys must have filled for the same sub-chunk.
DF_HD inline const float* KeysAt(const Keys& k, int64_t m, int64_t pos, const float* ka) {
  return k.Inside() ? ka : k.l + pos * m;
}

}  // namespace darkformer::cuda_scan
