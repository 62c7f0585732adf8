// The positive-random-feature estimators against their expectations: for fixed (x, y) the mean of
// phi(x).phi(y) over independent draws approaches exp(x^T Sigma y) (Sigma = I for performer and
// lfk at init, M^T M for darkformer); one draw's variance matches
// exp(2 x^T Sigma y) (exp((x+y)^T Sigma (x+y)) - 1) / m for iid rows; relative MSE falls like 1/m.
// Bounds are 5 standard errors, from the closed form where one exists.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <iostream>

#include "attention/darkformer_kernel.h"
#include "attention/lfk_kernel.h"
#include "attention/performer_kernel.h"
#include "attention/positive_features.h"
#include "attention/random_projection.h"

namespace darkformer {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

torch::Tensor TestX() { return torch::tensor({0.3, -0.2, 0.25, 0.1}, kF64); }
torch::Tensor TestY() { return torch::tensor({0.2, 0.3, -0.1, 0.2}, kF64); }
torch::Tensor TestM() {  // a fixed, non-trivial 4 x 4 M for darkformer
  return torch::tensor({0.9, 0.2, 0.0, -0.1, 0.1, 1.1, 0.3, 0.0, -0.2, 0.0, 0.8, 0.2, 0.0, 0.1, -0.3, 1.2}, kF64).view({4, 4});
}

// phi(x).phi(y) for each of N draws w_NMD (the draws play the role of heads), in fp64.
torch::Tensor Estimates(const torch::Tensor& x_D, const torch::Tensor& y_D, const torch::Tensor& w_NMD) {
  const int64_t n = w_NMD.size(0), d = x_D.size(0);
  const auto lx = LogPositiveFeatures(x_D.view({1, 1, 1, d}).expand({1, n, 1, d}), w_NMD);
  const auto ly = LogPositiveFeatures(y_D.view({1, 1, 1, d}).expand({1, n, 1, d}), w_NMD);
  return torch::exp(lx + ly).sum(-1).view({n});
}

// Closed-form moments of one feature product Z = exp(w.u - c), w ~ N(0, I), u = M(x+y):
// E[Z^k] = exp(k^2 |u|^2 / 2 - k c), c = (|Mx|^2 + |My|^2) / 2.
struct Moments {
  double mean, variance, fourth_central;
};
Moments FeatureMoments(const torch::Tensor& mx, const torch::Tensor& my) {
  const double s2 = (mx + my).pow(2).sum().item<double>();
  const double c = 0.5 * (mx.pow(2).sum().item<double>() + my.pow(2).sum().item<double>());
  auto raw = [&](int k) { return std::exp(0.5 * k * k * s2 - k * c); };
  const double mu = raw(1);
  return {mu, raw(2) - mu * mu, raw(4) - 4 * mu * raw(3) + 6 * mu * mu * raw(2) - 3 * std::pow(mu, 4)};
}

void CheckMeanAndVariance(const char* name, const torch::Tensor& z_N, const Moments& moments) {
  const double n = static_cast<double>(z_N.size(0));
  const double mean = z_N.mean().item<double>(), var = z_N.var().item<double>();
  const double mean_se = std::sqrt(moments.variance / n);
  const double var_se = std::sqrt((moments.fourth_central - moments.variance * moments.variance) / n);
  std::cout << "[" << name << "] N=" << n << " mean " << mean << " vs target " << moments.mean << " (|diff|/SE "
            << std::abs(mean - moments.mean) / mean_se << "); variance " << var << " vs closed form "
            << moments.variance << " (|diff|/SE " << std::abs(var - moments.variance) / var_se << ")\n";
  EXPECT_LE(std::abs(mean - moments.mean), 5 * mean_se) << name;
  EXPECT_LE(std::abs(var - moments.variance), 5 * var_se) << name;
}

TEST(EstimatorTest, PerformerIidUnbiasedWithClosedFormVariance) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto w = DrawProjections(ProjectionKind::kIid, 400000, 1, 4, gen).to(torch::kFloat64);
  CheckMeanAndVariance("performer iid m=1", Estimates(TestX(), TestY(), w), FeatureMoments(TestX(), TestY()));
}

TEST(EstimatorTest, DarkformerIidUnbiasedForMtM) {
  // phi_Sigma(x) = exp(W(Mx) - |Mx|^2/2)/sqrt(m): the target is exp(x^T M^T M y).
  auto gen = at::make_generator<at::CPUGeneratorImpl>(12);
  const auto w = DrawProjections(ProjectionKind::kIid, 400000, 1, 4, gen).to(torch::kFloat64);
  const auto mx = torch::matmul(TestM(), TestX()), my = torch::matmul(TestM(), TestY());
  const auto moments = FeatureMoments(mx, my);
  const double target = std::exp(torch::dot(TestX(), torch::matmul(TestM().t().mm(TestM()), TestY())).item<double>());
  EXPECT_NEAR(moments.mean, target, 1e-12);
  CheckMeanAndVariance("darkformer iid m=1", Estimates(mx, my, w), moments);
}

// Relative MSE of the m-feature estimator: iid closed form (exp((x+y)^T(x+y)) - 1) / m.
TEST(EstimatorTest, RelativeMseFallsLikeOneOverM) {
  const auto moments = FeatureMoments(TestX(), TestY());
  const double unit = moments.variance / (moments.mean * moments.mean);
  double previous_orthogonal = 1e9;
  for (int64_t m : {4, 16, 64, 256}) {
    for (auto kind : {ProjectionKind::kIid, ProjectionKind::kOrthogonal}) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + m);
      const int64_t n = 20000;
      const auto w = DrawProjections(kind, n, m, 4, gen).to(torch::kFloat64);
      const auto rel_sq_N = (Estimates(TestX(), TestY(), w) / moments.mean - 1.0).pow(2);
      const double rel_mse = rel_sq_N.mean().item<double>();
      const double se = rel_sq_N.std().item<double>() / std::sqrt(static_cast<double>(n));
      const bool iid = kind == ProjectionKind::kIid;
      std::cout << "[relative MSE] " << (iid ? "iid       " : "orthogonal") << " m=" << m << ": " << rel_mse << " +- "
                << se << " (iid closed form " << unit / m << "; m * relMSE = " << m * rel_mse << ")\n";
      if (iid) {
        EXPECT_LE(std::abs(rel_mse - unit / m), 5 * se) << "m=" << m;
      } else {
        EXPECT_LE(rel_mse, unit / m + 5 * se) << "orthogonal must not be worse than iid, m=" << m;
        EXPECT_LT(rel_mse, previous_orthogonal);
        previous_orthogonal = rel_mse;
      }
    }
  }
}

// The kernels' own feature maps over independent seeds (each kernel is one draw).
template <typename Kernel>
void CheckKernelOverSeeds(const char* name, const std::string& options, double target,
                          const std::function<void(Kernel&)>& prepare = {}) {
  const int64_t n = 3000, m = 4;
  std::vector<double> estimates;
  KernelShape shape;
  shape.num_heads = 1;
  shape.head_dim = 4;
  for (int64_t seed = 0; seed < n; ++seed) {
    Kernel kernel(shape, Kernel::ContainedType::Options::Read(ConfigReader(
                             YAML::Load(options + ", num_features: " + std::to_string(m) + ", seed: " + std::to_string(seed) + "}"),
                             "attention.kernel")));
    kernel->to(torch::kFloat64);
    if (prepare) prepare(kernel);
    torch::NoGradGuard no_grad;
    const torch::Tensor lx = kernel->LogFeatures(TestX().view({1, 1, 1, 4}));
    const torch::Tensor ly = kernel->LogFeatures(TestY().view({1, 1, 1, 4}));
    estimates.push_back(torch::exp(lx + ly).sum().item<double>());
  }
  const auto z = torch::tensor(estimates, kF64);
  const double mean = z.mean().item<double>(), se = z.std().item<double>() / std::sqrt(static_cast<double>(n));
  std::cout << "[" << name << " over " << n << " seeds, m=" << m << "] mean " << mean << " vs target " << target
            << " (|diff|/SE " << std::abs(mean - target) / se << ")\n";
  EXPECT_LE(std::abs(mean - target), 5 * se) << name;
}

TEST(EstimatorTest, KernelFeatureMapsUnbiasedOverSeeds) {
  const double plain = std::exp(torch::dot(TestX(), TestY()).item<double>());
  CheckKernelOverSeeds<PerformerKernel>("performer", "{projection: orthogonal", plain);
  CheckKernelOverSeeds<LfkKernel>("lfk at init", "{projection: orthogonal", plain);
  const auto sigma = TestM().t().mm(TestM());
  const double data_aware = std::exp(torch::dot(TestX(), torch::matmul(sigma, TestY())).item<double>());
  CheckKernelOverSeeds<DarkformerKernel>("darkformer", "{projection: orthogonal", data_aware, [](DarkformerKernel& k) {
    torch::NoGradGuard no_grad;
    k->M.copy_(TestM().unsqueeze(0));
  });
}

TEST(RandomProjectionTest, OrthogonalBlocksAndReproducibleDraws) {
  const auto w = DrawProjection(ProjectionKind::kOrthogonal, 10, 4, 7);
  ASSERT_EQ(w.sizes(), torch::IntArrayRef({10, 4}));
  EXPECT_EQ(w.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(w, DrawProjection(ProjectionKind::kOrthogonal, 10, 4, 7)));
  EXPECT_FALSE(torch::equal(w, DrawProjection(ProjectionKind::kOrthogonal, 10, 4, 8)));
  const auto block = w.narrow(0, 0, 4).to(torch::kFloat64);
  const auto directions = block / block.norm(2, 1, true);
  EXPECT_LE((directions.mm(directions.t()) - torch::eye(4, kF64)).abs().max().item<double>(), 1e-5);
  // chi(d) norms: E|w|^2 = d.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto many = DrawProjections(ProjectionKind::kOrthogonal, 5000, 8, 4, gen).to(torch::kFloat64);
  const auto sq_norms = many.pow(2).sum(-1).flatten();
  const double mean = sq_norms.mean().item<double>();
  const double se = std::sqrt(2.0 * 4 / sq_norms.size(0));  // Var chi^2_4 = 8
  std::cout << "[orthogonal draws] mean |w|^2 = " << mean << " vs d = 4 (|diff|/SE " << std::abs(mean - 4) / se << ")\n";
  EXPECT_LE(std::abs(mean - 4.0), 5 * se);
}

}  // namespace
}  // namespace darkformer
