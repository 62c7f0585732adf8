// Trigonometric random-feature attention (see trig_kernel.h).
#include "attention/trig_kernel.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "attention/kernel_registry.h"
#include "attention/ops/fp32_products.h"
#include "attention/positive_features.h"
#include "attention/softmax_estimator.h"

namespace darkformer {

TrigKernelImpl::Options TrigKernelImpl::Options::Read(const ConfigReader& reader) {
  Options o{SignedOptions::Read(reader, /*with_redraw=*/true)};
  reader.RejectUnknown();
  return o;
}

TrigKernelImpl::TrigKernelImpl(const KernelShape& shape, const Options& options) : SignedFeatureKernel(shape, options) {
  RegisterDraw(shape.head_dim);
}

torch::Tensor TrigKernelImpl::SignedFeatures(const torch::Tensor& x_BNLD) const {
  const auto x = x_BNLD.to(FeatureDtype(x_BNLD.scalar_type()));
  const auto proj_BNLM = Fp32Matmul(x, projection_.to(x.device(), x.scalar_type()).t());
  const double m = static_cast<double>(projection_.size(0));
  return torch::cat({proj_BNLM.sin(), proj_BNLM.cos()}, -1) / std::sqrt(m);
}

torch::Tensor TrigKernelImpl::LogScale(const torch::Tensor& x_BNLD) const {
  return 0.5 * x_BNLD.to(FeatureDtype(x_BNLD.scalar_type())).pow(2).sum(-1);
}

double TrigKernelImpl::MaxLogFeature(const torch::Tensor& x_BHLD) const {
  return (0.5 * x_BHLD.to(torch::kFloat32).pow(2).sum(-1)).max().item<double>();
}

// Its registration (kernel_registry.h): the name, the row in the tables, the config section's doc.
namespace {

// kappa_hat / exp(x.y) per draw and pair, kappa_hat = exp(|x|^2/2 + |y|^2/2) mean_j cos(w_j.(x - y)),
// w_j ~ N(0, I) (001): m cos features carry as many random projections as performer's m exp features.
torch::Tensor TrigEstimatorRatios(const torch::Tensor& x_PD, const torch::Tensor& y_PD, int64_t num_features,
                                  int64_t draws, uint64_t seed) {
  const auto x = x_PD.to(torch::kFloat64), y = y_PD.to(torch::kFloat64);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto w_NMD = torch::randn({draws, num_features, x.size(1)}, generator, torch::kFloat64);
  const auto cos_NPM = torch::matmul((x - y).unsqueeze(0), w_NMD.transpose(1, 2)).cos();
  const auto log_scale_P = 0.5 * (x.pow(2).sum(-1) + y.pow(2).sum(-1)) - (x * y).sum(-1);
  return cos_NPM.mean(-1) * log_scale_P.exp();
}

// Its variance per feature: (exp(|x|^2 + |y|^2) / 2) (1 + exp(-2|x - y|^2)) - exp(2 x.y)
// (E cos^2 = (1 + E cos 2w.u) / 2).
torch::Tensor TrigVariancePerFeature(const torch::Tensor& x_PD, const torch::Tensor& y_PD) {
  const auto x = x_PD.to(torch::kFloat64), y = y_PD.to(torch::kFloat64);
  const auto second = 0.5 * (x.pow(2).sum(-1) + y.pow(2).sum(-1)).exp() * (1 + (-2 * (x - y).pow(2).sum(-1)).exp());
  return second - (2 * (x * y).sum(-1)).exp();
}

[[maybe_unused]] const bool kRegistered = RegisterKernel<TrigKernel>(
    "trig", 80, "RFA (001): phi(x) = exp(|x|^2/2)/sqrt(m) [sin Wx, cos Wx]; signed features, composite path");
// Its estimator (softmax_estimator.h): nothing to fit.
[[maybe_unused]] const bool kEstimator = RegisterEstimator(
    {"trig", "trig", /*dense_exponential=*/false, [](const torch::Tensor&, const torch::Tensor&) {
       return FittedEstimator{"exp(x.y)", SoftmaxTargetValue, TrigEstimatorRatios, TrigVariancePerFeature};
     }});
}  // namespace

}  // namespace darkformer
