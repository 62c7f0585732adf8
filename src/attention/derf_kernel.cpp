// ADERF and SDERF attention (see derf_kernel.h).
#include "attention/derf_kernel.h"

#include <cmath>

#include "attention/derf_parameters.h"
#include "attention/kernel_registry.h"
#include "attention/softmax_estimator.h"

namespace darkformer {

DerfKernelImpl::Options DerfKernelImpl::Options::Read(const ConfigReader& reader, Variant variant) {
  Options o{FeatureKernelOptions::Read(reader, /*with_redraw=*/true, /*with_op=*/true)};
  if (variant == Variant::kAsymmetric) {
    o.ridge = reader.Get<double>(
        "ridge", o.ridge,
        KeySpec("M_k + ridge (tr M_k / d) I: keeps Thm 4.2's inverses finite on a singular batch")
            .Above(0, "a fraction of the mean eigenvalue added to the calibration second moments")
            .Max(1));
  }
  reader.RejectUnknown();
  return o;
}

DerfKernelImpl::DerfKernelImpl(const KernelShape& shape, const Options& options, Variant variant)
    : LogFeatureKernel(shape, options.features), variant_(variant), ridge_(options.ridge) {
  const int64_t d = shape.head_dim;
  RegisterDraw(d);
  a_ = register_buffer("a", torch::zeros({d}, torch::kFloat32));
  p_query_ = register_buffer("p_query", torch::eye(d, torch::kFloat32));
  p_key_ = register_buffer("p_key", torch::eye(d, torch::kFloat32));
}

torch::Tensor DerfKernelImpl::LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                              bool is_query) const {
  return DerfLogFeatures(x_BNLD, params.at(0), params.at(1), is_query ? params.at(2) : params.at(3));
}

void DerfKernelImpl::Calibrate(const torch::Tensor& q_BHLD, const torch::Tensor& k_BHLD, double scale) {
  torch::NoGradGuard no_grad;
  const double root = std::sqrt(scale);
  const int64_t d = q_BHLD.size(-1);
  const auto stats = DerfStatistics::Of(q_BHLD.reshape({-1, d}).to(torch::kFloat64) * root,
                                        k_BHLD.reshape({-1, d}).to(torch::kFloat64) * root,
                                        kernel_name() + " calibration (layer " + std::to_string(shape_.layer_index) + ")");
  const auto p = variant_ == Variant::kAsymmetric ? AderfParameters(stats, ridge_) : SderfParameters(stats);
  a_.copy_(p.a_D);
  p_query_.copy_(p.p_query_DD);
  p_key_.copy_(p.p_key_DD);
}

// Its registration (kernel_registry.h): the name, the row in the tables, the config section's doc.
namespace {
[[maybe_unused]] const bool kRegisteredAderf = RegisterKernel<AderfKernel>(
    "aderf", 60, "FAVOR# ADERF (002 Thm 4.2): gerf with A* on P x and P^-T y, P from an SVD of a calibration batch's second moments");
[[maybe_unused]] const bool kRegisteredSderf = RegisterKernel<SderfKernel>(
    "sderf", 70, "FAVOR# SDERF (002 Thm 4.3): x and y rotated by Q^T (eigenvectors of mean (x+y)(x+y)^T), a per-coordinate A*");
// Their estimators (softmax_estimator.h): Thm 4.2's and 4.3's parameters from the sample, at the
// default ridge.
[[maybe_unused]] const bool kEstimatorAderf = RegisterEstimator(
    {"aderf", "aderf", /*dense_exponential=*/true,
     DerfFit([](const DerfStatistics& s) { return AderfParameters(s, DerfKernelImpl::Options{}.ridge); })});
[[maybe_unused]] const bool kEstimatorSderf =
    RegisterEstimator({"sderf", "sderf", /*dense_exponential=*/true, DerfFit(SderfParameters)});
}  // namespace

}  // namespace darkformer
