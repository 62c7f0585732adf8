// SLAY (003): the Gauss-Laguerre rule, the quadrature's convergence to the spherical Yat kernel,
// the features' unbiasedness for the quadrature kernel (exact and sketched t^2), the causal path
// against its masked quadratic form, and fp64 finite differences.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "attention/finite_difference.h"
#include "attention/kernel_registry.h"
#include "attention/slay_kernel.h"

namespace darkformer {
namespace {

std::shared_ptr<SlayKernelImpl> MakeSlay(int64_t heads, int64_t d, const std::string& yaml) {
  KernelShape shape;
  shape.num_heads = heads;
  shape.head_dim = d;
  auto kernel = MakeAttentionKernel("slay", shape, ConfigReader(YAML::Load(yaml), "attention.slay"));
  return std::dynamic_pointer_cast<SlayKernelImpl>(kernel.ptr());
}

TEST(SlayTest, GaussLaguerreIntegratesPolynomialsExactly) {
  // An n-point rule is exact for u^k, k <= 2n - 1: int_0^inf u^k e^-u du = k!.
  const int64_t n = 6;
  const auto [u, a] = GaussLaguerre(n);
  double factorial = 1;
  for (int64_t k = 0; k < 2 * n; ++k) {
    if (k > 0) factorial *= k;
    const double sum = (a * u.pow(k)).sum().item<double>();
    EXPECT_NEAR(sum / factorial, 1.0, 1e-9) << "k=" << k;
  }
}

TEST(SlayTest, QuadratureConvergesToTheYatKernel) {
  const auto t = torch::linspace(-1.0, 0.8, 91, torch::kFloat64);
  double previous = 1e300;
  for (const int64_t nodes : {2, 4, 8, 16, 32}) {
    const double err = (YatQuadrature(t, 0.1, nodes) - YatKernel(t, 0.1)).abs().max().item<double>();
    std::cout << "[slay] epsilon 0.1, t in [-1, 0.8]: " << nodes << " nodes, max |quadrature - K| = " << err << "\n";
    EXPECT_LT(err, previous) << nodes;
    previous = err;
  }
  EXPECT_LT(previous, 1e-2);
}

TEST(SlayTest, FeaturesAreUnbiasedForTheQuadratureKernel) {
  // The features' inner product is the mean over random features j of
  // z_j = sum_i (a_i / C) t^2 exp(sqrt(b_i) w_j.(q^ + k^) - b_i), whose expectation is the
  // quadrature kernel. Checked as an identity for 3 nodes, and statistically for 1 node: with 3
  // nodes the largest b_i is ~6, so z_j is log-normal with sigma up to ~5 and its sample variance
  // is no usable error bar.
  torch::manual_seed(0);
  const int64_t d = 4, m = 100000;
  const auto q = torch::randn({5, d}, torch::kFloat64), k = torch::randn({5, d}, torch::kFloat64);
  const auto qh = q / q.norm(2, -1, true), kh = k / k.norm(2, -1, true);
  const auto t = (qh * kh).sum(-1);
  const double c = 2.1;
  for (const int64_t nodes : {1, 3}) {
    auto slay = MakeSlay(1, d, "{num_features: 100000, projection: iid, sketch_dim: 0, nodes: " + std::to_string(nodes) + "}");
    const auto [u, a] = GaussLaguerre(nodes);
    const auto proj = torch::matmul(qh + kh, slay->projection().to(torch::kFloat64).t());  // 5 x m
    auto z = torch::zeros_like(proj);
    for (int64_t i = 0; i < nodes; ++i) {
      const double beta = 2 * u[i].item<double>() / c;
      z = z + (a[i].item<double>() / c) * t.pow(2).unsqueeze(1) * (std::sqrt(beta) * proj - beta).exp();
    }
    const auto mean = z.mean(1);
    const auto features = (slay->Features(q.view({1, 1, 5, d})) * slay->Features(k.view({1, 1, 5, d}))).sum(-1)[0][0];
    EXPECT_LE((features - mean).abs().max().item<double>(), 1e-9 * mean.abs().max().item<double>() + 1e-12) << nodes;
    if (nodes == 1) {
      const auto se = (z.var(1) / m).sqrt();
      const double worst = ((mean - YatQuadrature(t, 0.1, nodes)).abs() / se).max().item<double>();
      std::cout << "[slay] 1 node: features vs quadrature kernel, worst " << worst << " standard errors\n";
      EXPECT_LE(worst, 5.0);
    }
  }
}

TEST(SlayTest, SketchIsUnbiasedForTheSquaredCosine) {
  torch::manual_seed(1);
  const int64_t d = 6, p = 50000;
  auto slay = MakeSlay(1, d, "{num_features: 1, sketch_dim: 50000, nodes: 1}");
  const auto s = slay->named_buffers()["sketch"].to(torch::kFloat64);
  const auto q = torch::randn({4, d}, torch::kFloat64), k = torch::randn({4, d}, torch::kFloat64);
  const auto qh = q / q.norm(2, -1, true), kh = k / k.norm(2, -1, true);
  // Per sketch row r: (s1_r.q^)(s2_r.q^)(s1_r.k^)(s2_r.k^), mean -> (q^.k^)^2.
  const auto z = torch::matmul(qh, s[0].t()) * torch::matmul(qh, s[1].t()) * torch::matmul(kh, s[0].t()) *
                 torch::matmul(kh, s[1].t());
  const auto mean = z.mean(1), se = (z.var(1) / p).sqrt();
  const double worst = ((mean - (qh * kh).sum(-1).pow(2)).abs() / se).max().item<double>();
  std::cout << "[slay] sketch vs t^2: worst " << worst << " standard errors\n";
  EXPECT_LE(worst, 5.0);
}

TEST(SlayTest, ForwardEqualsTheMaskedQuadraticFormAndFiniteDifferences) {
  torch::manual_seed(2);
  const int64_t heads = 2, length = 13, d = 3;
  auto slay = MakeSlay(heads, d, "{num_features: 4, sketch_dim: 0, nodes: 2, chunk_size: 4}");
  slay->to(torch::kFloat64);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  auto q = torch::randn({1, heads, length, d}, f64).requires_grad_(), k = torch::randn({1, heads, length, d}, f64).requires_grad_();
  auto v = torch::randn({1, heads, length, d}, f64).requires_grad_();
  AttentionCall call;
  for (const bool causal : {true, false}) {
    call.causal = causal;
    torch::NoGradGuard no_grad;
    auto a = torch::matmul(slay->Features(q), slay->Features(k).transpose(-1, -2));
    if (causal) a = a.tril();
    const auto reference = torch::matmul(a, v) / a.sum(-1, true);
    const double err = ((slay->forward(q, k, v, call) - reference).abs().max() / reference.abs().max()).item<double>();
    std::cout << "[slay] " << (causal ? "causal" : "non-causal") << " vs quadratic form: " << err << "\n";
    EXPECT_LE(err, 1e-10);
  }
  call.causal = true;
  const auto weights = torch::randn({1, heads, length, d}, f64);
  auto loss = [&] { return (slay->forward(q, k, v, call) * weights).sum(); };
  const double worst = testing::MaxGradientError(loss, {q, k, v});
  std::cout << "[slay] finite differences: worst relative gradient error " << worst << "\n";
  EXPECT_LE(worst, 1e-6);
}

TEST(SlayTest, OptionsAreChecked) {
  for (const std::string yaml : {"{nodes: 0}", "{epsilon: 0}", "{sketch_dim: -1}"}) {
    try {
      MakeSlay(1, 4, yaml);
      ADD_FAILURE() << yaml << ": no error";
    } catch (const Error& e) {
      const auto key = YAML::Load(yaml).begin()->first.as<std::string>();
      EXPECT_NE(std::string(e.what()).find("attention.slay." + key), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace darkformer
