// The fast forms' guard (see normaliser_check.h).
#include "attention/ops/normaliser_check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace darkformer::causal_ops {

namespace {
thread_local torch::Tensor row_normalisers;
}  // namespace

void RecordRowNormalisers(const torch::Tensor& den_BHL) { row_normalisers = den_BHL; }

torch::Tensor TakeRowNormalisers() { return std::exchange(row_normalisers, torch::Tensor()); }

double MinFastNormaliser(int64_t length, int64_t num_features) {
  const double terms = static_cast<double>(std::max<int64_t>(length, 1)) *
                       static_cast<double>(num_features > 0 ? num_features : int64_t{1} << 16);
  return terms * std::ldexp(1.0, -102);
}

bool AnyRowBelowGuard(const torch::Tensor& den_BHL, double guard) {
  // Each row's minimum first, then the rows: a whole-tensor reduction over more than LibTorch's
  // grain (32768 elements) runs through per-thread buffers, one more op that only long calls make
  // (the chunk-parallel form's op count must not depend on L).
  return den_BHL.defined() && den_BHL.numel() > 0 && (den_BHL.amin(-1) < guard).any().item<bool>();
}

torch::Tensor GuardedDivisor(const torch::Tensor& den) {
  return den.clamp_min(den.scalar_type() == torch::kFloat64 ? std::numeric_limits<double>::min()
                                                            : std::numeric_limits<float>::min());
}

}  // namespace darkformer::causal_ops
