// Random projection draws (see random_projection.h).
#include "attention/random_projection.h"

#include <ATen/CPUGeneratorImpl.h>

#include "util/error.h"
#include "util/hashing.h"

namespace darkformer {

ProjectionKind ParseProjectionKind(const std::string& name, const std::string& key_path) {
  if (name == "iid") return ProjectionKind::kIid;
  if (name == "orthogonal") return ProjectionKind::kOrthogonal;
  Fail("config key '" + key_path + "': unknown projection '" + name + "'; valid: iid, orthogonal");
}

torch::Tensor DrawProjections(ProjectionKind kind, int64_t count, int64_t num_features, int64_t dim,
                              at::Generator& generator) {
  DF_CHECK(count > 0 && num_features > 0 && dim > 0,
           "DrawProjections: count, num_features and dim must be positive, got " << count << ", "
                                                                                 << num_features << ", " << dim);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  if (kind == ProjectionKind::kIid) {
    return at::normal(0.0, 1.0, {count, num_features, dim}, generator, f64).to(torch::kFloat32);
  }
  const int64_t blocks = (num_features + dim - 1) / dim;
  const auto gaussian_NBDD = at::normal(0.0, 1.0, {count, blocks, dim, dim}, generator, f64);
  auto [q_NBDD, r_NBDD] = torch::linalg_qr(gaussian_NBDD);
  // Sign-correct so Q is Haar-distributed (QR alone is biased by its sign convention).
  const auto signs_NBD = torch::sign(torch::diagonal(r_NBDD, 0, -2, -1));
  q_NBDD = q_NBDD * signs_NBD.unsqueeze(-2);
  const auto rows_NBDD = q_NBDD.transpose(-1, -2);  // rows orthonormal
  // chi(D) norms: the norm of a fresh D-dimensional standard Gaussian, one per row.
  const auto norms_NBD = at::normal(0.0, 1.0, {count, blocks, dim, dim}, generator, f64).norm(2, -1);
  const auto w_NMD = (rows_NBDD * norms_NBD.unsqueeze(-1)).reshape({count, blocks * dim, dim});
  return w_NMD.narrow(1, 0, num_features).to(torch::kFloat32).contiguous();
}

torch::Tensor DrawProjection(ProjectionKind kind, int64_t num_features, int64_t dim, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return DrawProjections(kind, 1, num_features, dim, generator)[0];
}

uint64_t DrawSeed(uint64_t seed, int64_t draw_index) {
  // The draw_index-th output of a SplitMix64 stream started at `seed`: keeps (seed, draw) pairs
  // apart across layers and redraws.
  return SplitMix64(seed + kSplitMix64Gamma * static_cast<uint64_t>(draw_index));
}

}  // namespace darkformer
