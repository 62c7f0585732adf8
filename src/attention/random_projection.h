// Random projection matrices for positive random features (000 eq. 1; Performer's FAVOR+):
// iid rows w ~ N(0, I_d), or orthogonal blocks (QR of a Gaussian block) with chi(d) row norms.
// Draws come from a dedicated CPU generator seeded explicitly, so they are reproducible.
//
// Shape legend: N independent draws, M random features (rows), D input dim.
#pragma once

#include <torch/torch.h>

#include <string>

namespace darkformer {

enum class ProjectionKind { kIid, kOrthogonal };

// "iid" | "orthogonal"; anything else is an error naming `key_path`.
ProjectionKind ParseProjectionKind(const std::string& name, const std::string& key_path);

// N independent draws, fp32 on the CPU: w_NMD. Orthogonal: within each block of D consecutive
// rows the directions are orthonormal (Haar, via sign-corrected QR in fp64) and each row's norm is
// drawn independently from chi(D), so every row is marginally N(0, I_D) and the estimator stays
// unbiased.
torch::Tensor DrawProjections(ProjectionKind kind, int64_t count, int64_t num_features, int64_t dim,
                              at::Generator& generator);

// One draw w_MD from `seed` (a fresh generator per call).
torch::Tensor DrawProjection(ProjectionKind kind, int64_t num_features, int64_t dim, uint64_t seed);

// The seed of the `draw_index`-th draw of a kernel whose base seed is `seed` (redraws).
uint64_t DrawSeed(uint64_t seed, int64_t draw_index);

}  // namespace darkformer
