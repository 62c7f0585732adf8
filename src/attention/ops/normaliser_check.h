// The fast forms' guard. The chunk loop, the raw CPU kernel and the chunk-parallel form keep the
// scalar stabiliser (query: own row max; keys: scalar prefix max), whose normaliser has no lower
// bound: where a query's large features and the keys' large features sit in different
// coordinates, every term underflows. Where it stays at or above MinFastNormaliser(L, m) =
// L m 2^-102 their result is exact to fp32 rounding: a row sums at most L m terms, each a product
// of factors in (0, 1], so an underflow drops at most L m 2^-126 in absolute value, 2^-24 of such
// a normaliser (docs/kernels.md, "The normaliser at any scale"). Query rows below it take the
// per-feature form's output instead
// (per_feature_attention.h, normaliser >= 1). The choice is per row, from that row's own
// normaliser, so it reads no later token. A form records its per-row normaliser here.
#pragma once

#include <torch/torch.h>

namespace darkformer::causal_ops {

// L m 2^-102 for L positions and m features (m = 0, unknown: 2^16 assumed).
double MinFastNormaliser(int64_t length, int64_t num_features);

// Records the normaliser of every query row of the forward that just ran on this thread,
// B x H x L (a view; nothing is copied), for the operator to take right after.
void RecordRowNormalisers(const torch::Tensor& den_BHL);
// Hands over what the last forward on this thread recorded (undefined when nothing was) and
// forgets it.
torch::Tensor TakeRowNormalisers();
// Whether any row is below `guard` (one reduction; a device sync on a GPU). A NaN normaliser (NaN
// inputs) counts as not below: the fast result stands, NaN as it is.
bool AnyRowBelowGuard(const torch::Tensor& den_BHL, double guard);

// The fast forms divide by max(den, the smallest normal) so that rows below the guard, whose
// values are replaced and whose gradients are zero, stay finite (0 / 0 would poison the shared
// backward). It never touches a returned value: a returned row has den >= L m 2^-102 >= 2^-102.
torch::Tensor GuardedDivisor(const torch::Tensor& den);

}  // namespace darkformer::causal_ops
