// The fast forms' guard (see normaliser_check.h).
#include "attention/ops/normaliser_check.h"

#include <limits>

namespace darkformer::causal_ops {

namespace {
thread_local double smallest_normaliser = std::numeric_limits<double>::infinity();
}  // namespace

void RecordSmallestNormaliser(const torch::Tensor& den) {
  // A NaN normaliser (NaN inputs) compares false below and leaves the fast result as it is.
  smallest_normaliser = den.numel() == 0 ? std::numeric_limits<double>::infinity() : den.min().item<double>();
}

double LastSmallestNormaliser() { return smallest_normaliser; }

}  // namespace darkformer::causal_ops
