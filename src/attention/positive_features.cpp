// Positive random features and their causal-safe stabiliser (see positive_features.h).
#include "attention/positive_features.h"

#include <cmath>

#include "attention/ops/fp32_products.h"
#include "util/error.h"

namespace darkformer {

torch::ScalarType FeatureDtype(torch::ScalarType input) {
  return input == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

torch::Tensor LogPositiveFeatures(const torch::Tensor& x_BHLD, const torch::Tensor& w) {
  DF_CHECK(x_BHLD.dim() == 4, "LogPositiveFeatures: x must be BHLD, got " << x_BHLD.sizes());
  DF_CHECK(w.dim() == 2 || w.dim() == 3, "LogPositiveFeatures: W must be MD or HMD, got " << w.sizes());
  const auto dtype = FeatureDtype(x_BHLD.scalar_type());
  // Contiguous so a row's features do not depend on its input's strides (a chunk slice vs a fresh
  // tensor take different GEMM paths and round differently): darkformer with M = I is then
  // bit-identical to Performer.
  const auto x = x_BHLD.to(dtype).contiguous();
  const auto w_cast = w.to(x.device(), dtype);
  const int64_t m = w.size(-2);
  // Shared W: one matmul; per-head W_HMD broadcasts over the batch.
  const auto proj_BHLM = w.dim() == 2 ? Fp32Matmul(x, w_cast.t()) : Fp32Matmul(x, w_cast.transpose(-1, -2).unsqueeze(0));
  // One pass over the L x m block, in place on the fresh matmul output (its backward needs only x
  // and W): log phi = Wx - |x|^2 / 2 - log(m) / 2.
  const auto offset_BHL1 = 0.5 * x.pow(2).sum(-1, /*keepdim=*/true) + 0.5 * std::log(static_cast<double>(m));
  return proj_BHLM.sub_(offset_BHL1);
}

torch::Tensor StabilisedQueryFeatures(const torch::Tensor& log_phi_BHLM) {
  const auto shift_BHL1 = log_phi_BHLM.amax(-1, /*keepdim=*/true).detach();
  return torch::exp(log_phi_BHLM - shift_BHL1);
}

KeyFeatures StabilisedKeyFeatures(const torch::Tensor& log_phi_BHLM) {
  const auto shift_BHL = log_phi_BHLM.amax(-1).detach();
  return {torch::exp(log_phi_BHLM - shift_BHL.unsqueeze(-1)), shift_BHL};
}

}  // namespace darkformer
