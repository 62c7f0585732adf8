// GERF / FAVOR++ attention (see gerf_kernel.h).
#include "attention/gerf_kernel.h"

#include <cmath>

#include "attention/kernel_registry.h"
#include "attention/ops/fp32_products.h"
#include "attention/positive_features.h"
#include "attention/softmax_estimator.h"

namespace darkformer {

double OptimalGerfA(double rho) {
  return (1.0 - 2.0 * rho - std::sqrt((2.0 * rho + 1.0) * (2.0 * rho + 1.0) + 8.0 * rho)) / 16.0;
}

double GerfRho(const torch::Tensor& x_ND, const torch::Tensor& y_ND) {
  const auto x = x_ND.to(torch::kFloat64), y = y_ND.to(torch::kFloat64);
  const double d = static_cast<double>(x.size(1));
  const auto cross = (x.mean(0) * y.mean(0)).sum();
  return ((x.pow(2).sum(1).mean() + y.pow(2).sum(1).mean() + 2.0 * cross) / d).item<double>();
}

torch::Tensor GerfClosedFormVariance(const torch::Tensor& x_PD, const torch::Tensor& y_PD, double a) {
  const auto x = x_PD.to(torch::kFloat64), y = y_PD.to(torch::kFloat64);
  const double d = static_cast<double>(x.size(1));
  const auto sum_sq = (x + y).pow(2).sum(1);
  const auto log_second_moment = d * std::log(1 - 4 * a) - 0.5 * d * std::log(1 - 8 * a) +
                                 2 * (1 - 4 * a) * sum_sq / (1 - 8 * a) - x.pow(2).sum(1) - y.pow(2).sum(1);
  return log_second_moment.exp() - (2 * (x * y).sum(1)).exp();
}

torch::Tensor GerfLogFeatures(const torch::Tensor& x_BNLD, const torch::Tensor& w_MD, const torch::Tensor& a) {
  const auto dtype = FeatureDtype(x_BNLD.scalar_type());
  const auto x = x_BNLD.to(dtype).contiguous();
  const auto w = w_MD.to(x.device(), dtype);
  const auto a_t = a.to(x.device(), dtype);
  const double d = static_cast<double>(x.size(-1)), m = static_cast<double>(w.size(0));
  const auto one_minus_4a = 1 - 4 * a_t;
  // log D + A |w|^2 - log(m) / 2 per feature, then B w^T x - |x|^2 / 2 per position (002 eq. 10).
  const auto per_feature_M = 0.25 * d * one_minus_4a.log() + a_t * w.pow(2).sum(1) - 0.5 * std::log(m);
  const auto proj_BNLM = Fp32Matmul(x, w.t()) * one_minus_4a.sqrt();
  return proj_BNLM + per_feature_M - 0.5 * x.pow(2).sum(-1, /*keepdim=*/true);
}

GerfKernelImpl::Options GerfKernelImpl::Options::Read(const ConfigReader& reader, const char* default_a,
                                                     const char* a_doc) {
  Options o{FeatureKernelOptions::Read(reader, /*with_redraw=*/true, /*with_op=*/true)};
  const auto a_text = reader.Get<std::string>("a", default_a, a_doc);
  if (a_text == "optimal") {
    o.optimal_a = true;
  } else {
    try {
      size_t used = 0;
      o.a = std::stod(a_text, &used);
      DF_CHECK(used == a_text.size(), "");
    } catch (...) {
      Fail("config key '" + reader.KeyPath("a") + "' must be a number below 1/8 or 'optimal', got '" + a_text + "'");
    }
    DF_CHECK(o.a < 0.125, "config key '" << reader.KeyPath("a") << "' must be below 1/8 (002 eq. 10), got " << o.a);
  }
  reader.RejectUnknown();
  return o;
}

GerfKernelImpl::GerfKernelImpl(const KernelShape& shape, const Options& options)
    : LogFeatureKernel(shape, options.features), optimal_a_(options.optimal_a) {
  RegisterDraw(shape.head_dim);
  a_ = register_buffer("a", torch::tensor({options.a}, torch::kFloat32));
}

torch::Tensor GerfKernelImpl::LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                              bool /*is_query*/) const {
  return GerfLogFeatures(x_BNLD, params.at(0), params.at(1));
}

void GerfKernelImpl::SetOptimalA(const torch::Tensor& x_ND, const torch::Tensor& y_ND) {
  if (!optimal_a_) return;
  a_.fill_(OptimalGerfA(GerfRho(x_ND, y_ND)));
}

void GerfKernelImpl::Calibrate(const torch::Tensor& q_BHLD, const torch::Tensor& k_BHLD, double scale) {
  torch::NoGradGuard no_grad;
  const double root = std::sqrt(scale);
  const int64_t d = q_BHLD.size(-1);
  SetOptimalA(q_BHLD.reshape({-1, d}) * root, k_BHLD.reshape({-1, d}) * root);
}

// Its registration (kernel_registry.h): the name, the row in the tables, the config section's doc.
namespace {
[[maybe_unused]] const bool kRegistered = RegisterKernel<GerfKernel>(
    "gerf", 40, "FAVOR++ (002 eq. 10): phi(x) = D exp(A|w|^2 + B w^T x - |x|^2/2)/sqrt(m), B = sqrt(1-4A), D = (1-4A)^(d/4)");
// Its estimator (softmax_estimator.h) at `a: optimal`: A* from the sample (002 eq. 13).
[[maybe_unused]] const bool kEstimator =
    RegisterEstimator({"gerf_optimal", "gerf", /*dense_exponential=*/true, DerfFit(GerfDerf)});
}  // namespace

}  // namespace darkformer
