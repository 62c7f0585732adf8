// SADERF / FAVOR# attention (see saderf_kernel.h).
#include "attention/saderf_kernel.h"

#include <cmath>

#include "attention/kernel_registry.h"
#include "attention/positive_features.h"
#include "attention/softmax_estimator.h"

namespace darkformer {

torch::Tensor SaderfPsi(const torch::Tensor& x_ND, const torch::Tensor& y_ND) {
  const auto x_sq = x_ND.to(torch::kFloat64).pow(2).sum(0), y_sq = y_ND.to(torch::kFloat64).pow(2).sum(0);
  const auto valid = (x_sq > 0) & (y_sq > 0);
  return torch::where(valid, (y_sq / x_sq.clamp_min(1e-300)).pow(0.25), torch::ones_like(x_sq));
}

SaderfKernelImpl::SaderfKernelImpl(const KernelShape& shape, const Options& options)
    : GerfKernelImpl(shape, options) {
  psi_ = register_buffer("psi", torch::ones({shape.head_dim}, torch::kFloat32));
}

torch::Tensor SaderfKernelImpl::LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                                bool is_query) const {
  const auto psi = params.at(2).to(x_BNLD.device(), FeatureDtype(x_BNLD.scalar_type()));
  return GerfLogFeatures(is_query ? x_BNLD * psi : x_BNLD / psi, params.at(0), params.at(1));
}

void SaderfKernelImpl::Calibrate(const torch::Tensor& q_BHLD, const torch::Tensor& k_BHLD, double scale) {
  torch::NoGradGuard no_grad;
  const double root = std::sqrt(scale);
  const int64_t d = q_BHLD.size(-1);
  const auto x_ND = q_BHLD.reshape({-1, d}).to(torch::kFloat64) * root;
  const auto y_ND = k_BHLD.reshape({-1, d}).to(torch::kFloat64) * root;
  const auto psi = SaderfPsi(x_ND, y_ND);
  psi_.copy_(psi.to(psi_.options()));
  SetOptimalA(x_ND * psi, y_ND / psi);
}

// Its registration (kernel_registry.h): the name, the row in the tables, the config section's doc.
namespace {
[[maybe_unused]] const bool kRegistered = RegisterKernel<SaderfKernel>(
    "saderf", 50, "FAVOR# (002 eq. 18-20): gerf on diag(psi) x and diag(psi)^-1 y, psi and A* from a calibration batch");
// Its estimator (softmax_estimator.h): psi and A* from the sample, as Calibrate.
[[maybe_unused]] const bool kEstimator =
    RegisterEstimator({"saderf", "saderf", /*dense_exponential=*/true, DerfFit(SaderfDerf)});
}  // namespace

}  // namespace darkformer
