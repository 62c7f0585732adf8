// GERF (FAVOR++) and SADERF (FAVOR#) estimators against 002's own claims: unbiased for exp(x^T y)
// for every A < 1/8, the closed-form variance of one feature's product (002 eq. 12), the
// variance-optimal A* (eq. 13) beating A = 0 on data with the seed's statistics, SADERF's psi
// (eq. 19) lowering it further on coordinate-wise anisotropic data, and calibration stored as
// buffers that a checkpoint carries.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "attention/gerf_kernel.h"
#include "attention/kernel_registry.h"
#include "attention/saderf_kernel.h"

namespace darkformer {
namespace {

KernelShape Shape(int64_t heads, int64_t d) {
  KernelShape s;
  s.num_heads = heads;
  s.head_dim = d;
  return s;
}

// One feature's products phi_j(x) phi_j(y) for `draws` iid w_j (m = 1 scaling), pairs x_PD, y_PD:
// a P x draws tensor whose row means estimate exp(x.y).
torch::Tensor SingleFeatureProducts(const torch::Tensor& x_PD, const torch::Tensor& y_PD, double a, int64_t draws,
                                    uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto w_MD = at::normal(0.0, 1.0, {draws, x_PD.size(1)}, generator, torch::kFloat64);
  const auto a_t = torch::tensor({a}, torch::kFloat64);
  // GerfLogFeatures includes -log(m)/2 per side; add it back to get m = 1 products.
  const auto lx = GerfLogFeatures(x_PD.view({1, 1, x_PD.size(0), -1}), w_MD, a_t)[0][0];
  const auto ly = GerfLogFeatures(y_PD.view({1, 1, y_PD.size(0), -1}), w_MD, a_t)[0][0];
  return (lx + ly + std::log(static_cast<double>(draws))).exp();
}

TEST(GerfTest, UnbiasedForEveryAAndMatchesTheClosedFormVariance) {
  torch::manual_seed(0);
  const int64_t d = 8, pairs = 6, draws = 400000;
  const auto x = 0.25 * torch::randn({pairs, d}, torch::kFloat64), y = 0.25 * torch::randn({pairs, d}, torch::kFloat64);
  const auto target = (x * y).sum(1).exp();
  for (const double a : {0.0, -0.2, 0.05, OptimalGerfA(GerfRho(x, y))}) {
    const auto products = SingleFeatureProducts(x, y, a, draws, 17);
    const auto mean = products.mean(1), var = products.var(1);
    const auto standard_error = (var / draws).sqrt();
    const double z = ((mean - target).abs() / standard_error).max().item<double>();
    const auto closed = GerfClosedFormVariance(x, y, a);
    // The sample variance's own standard error, sqrt((mu_4 - sigma^4) / n) with the empirical
    // fourth central moment (the products are log-normal-like: their variance estimate is noisy).
    const auto fourth = (products - mean.unsqueeze(1)).pow(4).mean(1);
    const auto var_standard_error = ((fourth - var.pow(2)).clamp_min(0) / draws).sqrt();
    const double var_z = ((var - closed).abs() / var_standard_error).max().item<double>();
    const double var_ratio_error = ((var / closed) - 1).abs().max().item<double>();
    std::cout << "[gerf] A=" << a << ": worst |mean - exp(x.y)| = " << z << " standard errors; empirical vs closed-form "
              << "variance: worst " << var_z << " standard errors (" << var_ratio_error << " relative)\n";
    EXPECT_LE(z, 5.0) << "A=" << a;
    EXPECT_LE(var_z, 5.0) << "A=" << a;
  }
}

TEST(GerfTest, OptimalALowersTheVarianceAgainstPerformer) {
  // 002 sec. 2.3: x, y from one distribution; A* from rho = mean |x + y|^2 / d minimises the
  // (shifted log-) variance. On such data its mean closed-form log-variance beats A = 0 and every
  // A of a grid is no better by more than a whisker.
  torch::manual_seed(1);
  const int64_t d = 16, pairs = 2000;
  for (const double sigma : {0.15, 0.3}) {
    const auto x = sigma * torch::randn({pairs, d}, torch::kFloat64), y = sigma * torch::randn({pairs, d}, torch::kFloat64);
    const double rho = GerfRho(x, y), a_star = OptimalGerfA(rho);
    auto mean_log_var = [&](double a) { return GerfClosedFormVariance(x, y, a).log().mean().item<double>(); };
    double best_grid = 1e300, best_a = 0;
    for (double a = -1.0; a < 0.12; a += 0.01) {
      if (mean_log_var(a) < best_grid) best_grid = mean_log_var(a), best_a = a;
    }
    std::cout << "[gerf] sigma=" << sigma << ": rho=" << rho << " A*=" << a_star << " mean log-variance A*: "
              << mean_log_var(a_star) << ", A=0: " << mean_log_var(0.0) << ", grid best " << best_grid << " at A="
              << best_a << "\n";
    EXPECT_LT(a_star, 0.0);
    EXPECT_LT(mean_log_var(a_star), mean_log_var(0.0));
    EXPECT_LE(mean_log_var(a_star), best_grid + 0.05);
  }
}

TEST(SaderfTest, PsiPreservesTheKernelAndLowersVarianceOnAnisotropicCoordinates) {
  // Coordinates with very different scales for queries and keys (002 sec. 4.3's case).
  torch::manual_seed(2);
  const int64_t d = 8, pairs = 2000;
  const auto scales_x = torch::logspace(-1.0, 0.0, d, 10, torch::kFloat64) * 0.6;
  const auto scales_y = scales_x.flip(0);
  const auto x = torch::randn({pairs, d}, torch::kFloat64) * scales_x, y = torch::randn({pairs, d}, torch::kFloat64) * scales_y;
  const auto psi = SaderfPsi(x, y);
  const auto tx = x * psi, ty = y / psi;
  EXPECT_LE(((tx * ty).sum(1) - (x * y).sum(1)).abs().max().item<double>(), 1e-12);  // same kernel
  const double gerf_a = OptimalGerfA(GerfRho(x, y)), saderf_a = OptimalGerfA(GerfRho(tx, ty));
  const double gerf = GerfClosedFormVariance(x, y, gerf_a).log().mean().item<double>();
  const double saderf = GerfClosedFormVariance(tx, ty, saderf_a).log().mean().item<double>();
  const double performer = GerfClosedFormVariance(x, y, 0.0).log().mean().item<double>();
  std::cout << "[saderf] mean log-variance: performer " << performer << ", gerf(A*) " << gerf << ", saderf " << saderf << "\n";
  EXPECT_LT(saderf, gerf);
  EXPECT_LT(gerf, performer);
}

TEST(SaderfTest, CalibrationSetsBuffersFromTheBatchAndTheFeaturesStayUnbiased) {
  torch::manual_seed(3);
  const int64_t heads = 2, d = 4, length = 64;
  const auto q = torch::randn({1, heads, length, d}) * torch::tensor({1.5, 1.0, 0.5, 0.2});
  const auto k = torch::randn({1, heads, length, d}) * torch::tensor({0.2, 0.5, 1.0, 1.5});
  auto kernel = MakeAttentionKernel("saderf", Shape(heads, d),
                                    ConfigReader(YAML::Load("{num_features: 20000, projection: iid}"), "attention.saderf"));
  ASSERT_TRUE(kernel->wants_calibration());
  kernel->Calibrate(q, k, 0.25);
  auto saderf = std::dynamic_pointer_cast<SaderfKernelImpl>(kernel.ptr());
  const auto expected_psi = SaderfPsi(q.reshape({-1, d}).to(torch::kFloat64) * 0.5, k.reshape({-1, d}).to(torch::kFloat64) * 0.5);
  EXPECT_LE((saderf->psi().to(torch::kFloat64) - expected_psi).abs().max().item<double>(), 1e-6);
  EXPECT_LT(saderf->a(), 0.0);
  auto buffers = kernel->named_buffers();
  EXPECT_TRUE(buffers.contains("psi") && buffers.contains("a"));  // saved with the weights
  // Unbiased after calibration: the m = 20000 estimate of exp(x.y) for a few pairs.
  const auto x = 0.5 * q.narrow(2, 0, 4).to(torch::kFloat64), y = 0.5 * k.narrow(2, 0, 4).to(torch::kFloat64);
  const auto estimate = torch::matmul(saderf->LogFeatures(x, true).exp(), saderf->LogFeatures(y, false).exp().transpose(-1, -2));
  const auto target = torch::matmul(x, y.transpose(-1, -2)).exp();
  const double rel = ((estimate - target).abs() / target).max().item<double>();
  std::cout << "[saderf] m=20000 relative error after calibration: " << rel << "\n";
  EXPECT_LE(rel, 0.1);
}

TEST(GerfTest, FixedAIsTakenAndOptimalWaitsForCalibration) {
  auto fixed = MakeAttentionKernel("gerf", Shape(1, 4), ConfigReader(YAML::Load("{a: -0.3}"), "attention.gerf"));
  EXPECT_FALSE(fixed->wants_calibration());
  EXPECT_NEAR(std::dynamic_pointer_cast<GerfKernelImpl>(fixed.ptr())->a(), -0.3, 1e-7);
  auto optimal = MakeAttentionKernel("gerf", Shape(1, 4), ConfigReader(YAML::Load("{a: optimal}"), "attention.gerf"));
  EXPECT_TRUE(optimal->wants_calibration());
  auto gerf = std::dynamic_pointer_cast<GerfKernelImpl>(optimal.ptr());
  EXPECT_EQ(gerf->a(), 0.0);  // Performer until calibrated
  const auto q = torch::randn({1, 1, 50, 4}), k = torch::randn({1, 1, 50, 4});
  optimal->Calibrate(q, k, 0.5);
  const double root = std::sqrt(0.5);
  EXPECT_NEAR(gerf->a(), OptimalGerfA(GerfRho(q.view({-1, 4}) * root, k.view({-1, 4}) * root)), 1e-6);
}

}  // namespace
}  // namespace darkformer
