// ADERF and SDERF (FAVOR#, 002 sec. 4) against what we did not write: Gaussian integrals
// (unbiasedness and the closed-form variance at random valid parameters, by Monte Carlo), a
// numerical minimiser of the objective (L-BFGS from several starts against Thm 4.2 / 4.3's closed
// forms), the special-case ordering the seed's Venn diagram implies, and calibration into buffers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "attention/derf_kernel.h"
#include "attention/derf_parameters.h"
#include "attention/kernel_registry.h"

namespace darkformer {
namespace {

constexpr auto kF64 = torch::kFloat64;

// A random valid DERF (Thm 4.1's conditions): a_l < 1/8 and P_2 = P_1^-T. `symmetric` draws
// SDERF's form (P_1 = P_2 orthogonal, a per coordinate), else ADERF's (a scalar, P_1 dense).
DerfParameters RandomValid(int64_t d, bool symmetric, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  if (symmetric) {
    const auto o = std::get<0>(torch::linalg_qr(torch::randn({d, d}, g, kF64)));
    return {torch::rand({d}, g, kF64) * 0.45 - 0.35, o, o.clone()};
  }
  const auto p1 = torch::eye(d, kF64) + 0.3 * torch::randn({d, d}, g, kF64);
  return {torch::full({d}, -0.2, kF64), p1, torch::linalg_inv(p1).t().contiguous()};
}

// Anisotropic synthetic data: rows of N(mean, L L^T); `shared` draws keys from the queries'
// distribution (002 sec. 5.1's setting), else from mirrored scales and another rotation.
std::pair<torch::Tensor, torch::Tensor> Anisotropic(int64_t n, int64_t d, bool shared, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto scales = torch::logspace(-1.2, 0.0, d, 10, kF64) * 0.7;
  const auto rot_x = std::get<0>(torch::linalg_qr(torch::randn({d, d}, g, kF64)));
  const auto rot_y = shared ? rot_x : std::get<0>(torch::linalg_qr(torch::randn({d, d}, g, kF64)));
  const auto mean = 0.1 * torch::randn({d}, g, kF64);
  const auto x = torch::matmul(torch::randn({n, d}, g, kF64) * scales, rot_x.t()) + mean;
  const auto y = torch::matmul(torch::randn({n, d}, g, kF64) * (shared ? scales : scales.flip(0)), rot_y.t()) +
                 (shared ? mean : -0.5 * mean);
  return {x, y};
}

double Objective(const DerfParameters& p, const DerfStatistics& s) { return DerfObjective(p, s).item<double>(); }

TEST(DerfTest, UnbiasedAtRandomValidParametersAndMatchesTheClosedFormVariance) {
  torch::manual_seed(0);
  const int64_t d = 6, pairs = 5, draws = 400000;
  const auto x = 0.3 * torch::randn({pairs, d}, kF64), y = 0.3 * torch::randn({pairs, d}, kF64);
  const auto target = (x * y).sum(1).exp();
  for (const bool symmetric : {false, true}) {
    for (const uint64_t seed : {1, 2}) {
      const auto p = RandomValid(d, symmetric, seed);
      auto g = at::make_generator<at::CPUGeneratorImpl>(100 + seed);
      const auto w = torch::randn({draws, d}, g, kF64);
      // One feature's products f_1 f_2 per draw: undo the -log(m)/2 of each side.
      const auto products = (DerfLogFeatures(x.view({1, 1, pairs, d}), w, p.a_D, p.p_query_DD)[0][0] +
                             DerfLogFeatures(y.view({1, 1, pairs, d}), w, p.a_D, p.p_key_DD)[0][0] +
                             std::log(static_cast<double>(draws))).exp();
      const auto mean = products.mean(1), var = products.var(1);
      const double z = ((mean - target).abs() / (var / draws).sqrt()).max().item<double>();
      const auto closed = DerfClosedFormVariance(p, x, y);
      const auto fourth = (products - mean.unsqueeze(1)).pow(4).mean(1);
      const auto var_se = ((fourth - var.pow(2)).clamp_min(0) / draws).sqrt();
      const double var_z = ((var - closed).abs() / var_se).max().item<double>();
      std::cout << "[derf] " << (symmetric ? "sderf" : "aderf") << " form, seed " << seed
                << ": worst |mean - exp(x.y)| = " << z << " SE; empirical vs closed-form variance worst " << var_z
                << " SE (" << ((var / closed) - 1).abs().max().item<double>() << " relative)\n";
      EXPECT_LE(z, 3.0);
      EXPECT_LE(var_z, 3.0);
    }
  }
}

TEST(DerfTest, ObjectiveFromStatisticsEqualsThePairwiseMean) {
  const auto [x, y] = Anisotropic(60, 5, /*shared=*/false, 3);
  const auto s = DerfStatistics::Of(x, y, "test");
  const auto xi = x.repeat_interleave(60, 0), yj = y.repeat({60, 1});  // every (i, j)
  for (const bool symmetric : {false, true}) {
    const auto p = RandomValid(5, symmetric, 4);
    const double direct = DerfLogSecondMoment(p, xi, yj).mean().item<double>();
    EXPECT_NEAR(Objective(p, s), direct, 1e-10 * std::abs(direct) + 1e-12);
  }
}

// L-BFGS over the special case's free parameters from several starts; the best value reached.
double NumericalMinimum(const DerfStatistics& s, int64_t d, bool symmetric, int starts) {
  double best = 1e300;
  for (int start = 0; start < starts; ++start) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(50 + start);
    // a = 1/8 - exp(t) keeps a < 1/8; ADERF: a scalar, P_1 free, P_2 = P_1^-T; SDERF: a per
    // coordinate, P = exp(S - S^T) orthogonal.
    auto t = (torch::rand({symmetric ? d : 1}, g, kF64) * 2 - 1.5).requires_grad_();
    auto m = (symmetric ? 0.8 * torch::randn({d, d}, g, kF64) : torch::eye(d, kF64) + 0.3 * torch::randn({d, d}, g, kF64))
                 .requires_grad_();
    const auto params = [&] {
      const auto a = (0.125 - t.exp()).expand({d});
      if (symmetric) {
        const auto o = torch::linalg_matrix_exp(m - m.t());
        return DerfParameters{a, o, o};
      }
      return DerfParameters{a, m, torch::linalg_inv(m).t()};
    };
    torch::optim::LBFGS optimizer({t, m}, torch::optim::LBFGSOptions(1.0).max_iter(500).tolerance_grad(1e-12)
                                              .tolerance_change(1e-14).line_search_fn("strong_wolfe"));
    for (int round = 0; round < 6; ++round) {
      optimizer.step([&] {
        optimizer.zero_grad();
        auto loss = DerfObjective(params(), s);
        loss.backward();
        return loss;
      });
    }
    torch::NoGradGuard no_grad;
    const double value = DerfObjective(params(), s).item<double>();
    if (std::isfinite(value)) best = std::min(best, value);
  }
  return best;
}

TEST(DerfTest, ClosedFormsAreTheNumericalMinimaOfTheObjective) {
  const int64_t d = 4;
  for (const bool shared : {true, false}) {
    const auto [x, y] = Anisotropic(400, d, shared, 5);
    const auto s = DerfStatistics::Of(x, y, "test");
    const double aderf = Objective(AderfParameters(s, 1e-12), s), sderf = Objective(SderfParameters(s), s);
    const double aderf_numeric = NumericalMinimum(s, d, /*symmetric=*/false, 4);
    const double sderf_numeric = NumericalMinimum(s, d, /*symmetric=*/true, 4);
    std::cout << "[derf] " << (shared ? "shared" : "asymmetric") << " data: aderf closed form " << aderf
              << ", L-BFGS best of 4 starts " << aderf_numeric << "; sderf closed form " << sderf << ", L-BFGS "
              << sderf_numeric << "\n";
    EXPECT_NEAR(aderf, aderf_numeric, 1e-3);
    EXPECT_NEAR(sderf, sderf_numeric, 1e-3);
    // A global minimum: no start gets below it (beyond rounding).
    EXPECT_LE(aderf, aderf_numeric + 1e-9);
    EXPECT_LE(sderf, sderf_numeric + 1e-9);
  }
}

TEST(DerfTest, SpecialCasesAreOrderedAsTheirInclusionsImply) {
  const int64_t d = 8;
  for (const bool shared : {true, false}) {
    const auto [x, y] = Anisotropic(2000, d, shared, 6);
    const auto s = DerfStatistics::Of(x, y, "test");
    const double sderf = Objective(SderfParameters(s), s), aderf = Objective(AderfParameters(s, 1e-12), s),
                 saderf = Objective(SaderfDerf(s), s), gerf = Objective(GerfDerf(s), s),
                 performer = Objective(PerformerDerf(d), s);
    std::cout << "[derf] " << (shared ? "shared" : "asymmetric") << " data, objective (002 eq. 14): sderf " << sderf
              << ", aderf " << aderf << ", saderf " << saderf << ", gerf " << gerf << ", performer " << performer << "\n";
    // Inclusions (002 fig. 1): performer in gerf in saderf in aderf; gerf in sderf.
    EXPECT_LE(aderf, saderf + 1e-12);
    EXPECT_LE(saderf, gerf + 1e-12);
    EXPECT_LT(gerf, performer);
    EXPECT_LT(sderf, gerf);
    if (shared) {
      // Queries and keys from one distribution (002 sec. 5.1): SDERF is the lowest.
      EXPECT_LT(sderf, aderf);
    } else {
      // Neither of SDERF and ADERF contains the other: with mirrored query and key scales,
      // ADERF's rescaling wins. The ordering SDERF <= ADERF is the data's, not an inclusion.
      EXPECT_LT(aderf, sderf);
    }
  }
}

KernelShape Shape(int64_t heads, int64_t d) {
  KernelShape s;
  s.num_heads = heads;
  s.head_dim = d;
  return s;
}

TEST(DerfTest, CalibrationSetsBuffersFromTheBatchAndTheFeaturesStayUnbiased) {
  torch::manual_seed(7);
  const int64_t heads = 2, d = 4, length = 64;
  const auto q = torch::randn({1, heads, length, d}) * torch::tensor({1.5, 1.0, 0.5, 0.2});
  const auto k = torch::randn({1, heads, length, d}) * torch::tensor({0.2, 0.5, 1.0, 1.5});
  for (const std::string name : {"aderf", "sderf"}) {
    auto kernel = MakeAttentionKernel(name, Shape(heads, d),
                                      ConfigReader(YAML::Load("{num_features: 20000, projection: iid}"), "attention." + name));
    ASSERT_TRUE(kernel->wants_calibration());
    auto derf = std::dynamic_pointer_cast<DerfKernelImpl>(kernel.ptr());
    auto buffers = kernel->named_buffers();
    ASSERT_TRUE(buffers.contains("a") && buffers.contains("p_query") && buffers.contains("p_key"));
    // Performer until calibrated.
    EXPECT_EQ(buffers["a"].abs().max().item<double>(), 0.0);
    EXPECT_TRUE(torch::equal(buffers["p_query"], torch::eye(d)));
    kernel->Calibrate(q, k, 0.25);
    const auto s = DerfStatistics::Of(q.reshape({-1, d}).to(kF64) * 0.5, k.reshape({-1, d}).to(kF64) * 0.5, "test");
    const auto expected = name == "aderf" ? AderfParameters(s, derf->ridge()) : SderfParameters(s);
    EXPECT_LE((buffers["a"].to(kF64) - expected.a_D).abs().max().item<double>(), 1e-6);
    EXPECT_LE((buffers["p_query"].to(kF64) - expected.p_query_DD).abs().max().item<double>(), 1e-5);
    EXPECT_LE((buffers["p_key"].to(kF64) - expected.p_key_DD).abs().max().item<double>(), 1e-5);
    EXPECT_LT(buffers["a"].max().item<double>(), 0.0);  // A* < 0 wherever there is mass
    // P_query^T P_key = I (002 Thm 4.1) in the stored fp32 copies.
    const auto product = torch::matmul(buffers["p_query"].t(), buffers["p_key"]);
    EXPECT_LE((product - torch::eye(d)).abs().max().item<double>(), 1e-5);
    // Unbiased after calibration: the m = 20000 estimate of exp(x.y) for a few pairs.
    const auto x = 0.5 * q.narrow(2, 0, 4).to(kF64), y = 0.5 * k.narrow(2, 0, 4).to(kF64);
    const auto estimate =
        torch::matmul(derf->LogFeatures(x, true).exp(), derf->LogFeatures(y, false).exp().transpose(-1, -2));
    const auto target = torch::matmul(x, y.transpose(-1, -2)).exp();
    const double rel = ((estimate - target).abs() / target).max().item<double>();
    std::cout << "[" << name << "] m=20000 relative error after calibration: " << rel << "\n";
    EXPECT_LE(rel, 0.1);
  }
}

TEST(DerfTest, SingularOrEmptyBatchesGiveFiniteValidParameters) {
  // Fewer rows than d (M_k singular), a coordinate no query uses, and queries that are all zero.
  const int64_t d = 8;
  auto x = torch::randn({3, d}, kF64);
  x.select(1, 0).zero_();
  const auto y = torch::randn({5, d}, kF64);
  for (const auto& queries : {x, torch::zeros({4, d}, kF64)}) {
    const auto s = DerfStatistics::Of(queries, y, "test");
    for (const auto& p : {AderfParameters(s, 1e-4), SderfParameters(s)}) {
      const bool finite = torch::isfinite(p.a_D).all().item<bool>() && torch::isfinite(p.p_query_DD).all().item<bool>() &&
                          torch::isfinite(p.p_key_DD).all().item<bool>();
      EXPECT_TRUE(finite);
      EXPECT_LT(p.a_D.max().item<double>(), 0.125);
      const auto product = torch::matmul(p.p_query_DD.t(), p.p_key_DD);
      EXPECT_LE((product - torch::eye(d, kF64)).abs().max().item<double>(), 1e-8);
      EXPECT_TRUE(std::isfinite(Objective(p, s)));
    }
  }
  // Non-finite calibration data is refused, naming what was calibrated.
  auto bad = y.clone();
  bad[0][0] = std::nan("");
  try {
    DerfStatistics::Of(bad, y, "aderf calibration (layer 3)");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aderf calibration (layer 3)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace darkformer
