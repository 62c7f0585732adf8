// The fast forms' guard (see normaliser_check.h).
#include "attention/ops/normaliser_check.h"

#include <limits>
#include <utility>

namespace darkformer::causal_ops {

namespace {
thread_local torch::Tensor row_normalisers;
}  // namespace

void RecordRowNormalisers(const torch::Tensor& den_BHL) { row_normalisers = den_BHL; }

torch::Tensor TakeRowNormalisers() { return std::exchange(row_normalisers, torch::Tensor()); }

bool AnyRowBelowGuard(const torch::Tensor& den_BHL) {
  return den_BHL.defined() && den_BHL.numel() > 0 && (den_BHL < kFastFormMinNormaliser).any().item<bool>();
}

torch::Tensor GuardedDivisor(const torch::Tensor& den) {
  return den.clamp_min(den.scalar_type() == torch::kFloat64 ? std::numeric_limits<double>::min()
                                                            : std::numeric_limits<float>::min());
}

}  // namespace darkformer::causal_ops
