// The sub-chunk length S of the per-feature stabiliser (per_feature_chunks.h): the largest divisor
// of the chunk length C up to kMaxSubChunk (kMaxRawSubChunk in the raw CPU kernel). Inside a sub-chunk the pairs are summed feature by
// feature (the LibTorch and CUDA forms: G S m exponentials per position; the raw CPU kernel: G S m
// products, raw_cpu_pairs.h); a larger S leaves fewer sub-chunk references per chunk (each key is
// held against C / S of them). docs/attention.md has the figures.
// Torch-free: the raw CPU kernel includes it too.
#pragma once

#include <algorithm>
#include <cstdint>

namespace darkformer::causal_ops {

constexpr int64_t kMaxSubChunk = 8;
// The raw CPU kernel's: its pairs are products, not exponentials (raw_cpu_pairs.h), so a longer
// sub-chunk costs little there and saves state reads and folds.
constexpr int64_t kMaxRawSubChunk = 16;

inline int64_t SubChunk(int64_t chunk, int64_t longest = kMaxSubChunk) {
  for (int64_t s = std::min(chunk, longest); s > 1; --s) {
    if (chunk % s == 0) return s;
  }
  return 1;
}

}  // namespace darkformer::causal_ops
