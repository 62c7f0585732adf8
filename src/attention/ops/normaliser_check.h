// The fast forms' guard. The chunk loop, the raw CPU kernel and the chunk-parallel form keep the
// scalar stabiliser (query: own row max; keys: scalar prefix max), whose normaliser has no lower
// bound: where a query's large features and the keys' large features sit in different
// coordinates, every term underflows. Above kFastFormMinNormaliser their result is exact to fp32
// rounding: the terms an underflow drops are at most ~L m 2^-126 in absolute value, 2^-32 of the
// normaliser at any L m < 2^30 (docs/kernels.md, "The normaliser at any scale"). Below it, the
// operator discards the fast result and runs the per-feature form (per_feature_attention.h),
// whose normaliser is at least 1. A form records the smallest normaliser of its forward here.
#pragma once

#include <torch/torch.h>

namespace darkformer::causal_ops {

constexpr double kFastFormMinNormaliser = 0x1p-64;

// Records min(den) of the forward that just ran on this thread (one reduction; a device sync on
// a GPU).
void RecordSmallestNormaliser(const torch::Tensor& den);
// The value recorded by the last forward on this thread; +inf before any.
double LastSmallestNormaliser();

}  // namespace darkformer::causal_ops
