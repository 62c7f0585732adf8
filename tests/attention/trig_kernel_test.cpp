// Trigonometric random features (001): unbiased for exp(x^T y); the causal path equals its masked
// quadratic form; signed normalisers (zero or negative) give finite outputs and gradients; fp64
// finite differences.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "attention/finite_difference.h"
#include "attention/kernel_registry.h"
#include "attention/trig_kernel.h"

namespace darkformer {
namespace {

std::shared_ptr<TrigKernelImpl> MakeTrig(int64_t heads, int64_t d, const std::string& yaml) {
  KernelShape shape;
  shape.num_heads = heads;
  shape.head_dim = d;
  auto kernel = MakeAttentionKernel("trig", shape, ConfigReader(YAML::Load(yaml), "attention.trig"));
  return std::dynamic_pointer_cast<TrigKernelImpl>(kernel.ptr());
}

TEST(TrigTest, UnbiasedForTheSoftmaxKernel) {
  torch::manual_seed(0);
  const int64_t d = 8, draws = 200000;
  auto trig = MakeTrig(1, d, "{num_features: 200000, projection: iid}");
  const auto x = 0.3 * torch::randn({6, d}, torch::kFloat64), y = 0.3 * torch::randn({6, d}, torch::kFloat64);
  // Per-feature products exp(|x|^2/2 + |y|^2/2) cos(w.(x - y)): their mean is the estimate.
  const auto w = trig->projection().to(torch::kFloat64);
  const auto scale = (0.5 * (x.pow(2).sum(1) + y.pow(2).sum(1))).exp();
  const auto products = scale.unsqueeze(1) * torch::matmul(x - y, w.t()).cos();
  const auto mean = products.mean(1), se = (products.var(1) / draws).sqrt();
  const auto target = (x * y).sum(1).exp();
  const double z = ((mean - target).abs() / se).max().item<double>();
  // The kernel's own features give the same estimate.
  const auto fx = trig->SignedFeatures(x.view({1, 1, 6, d}))[0][0], fy = trig->SignedFeatures(y.view({1, 1, 6, d}))[0][0];
  const auto feature_estimate = scale * (fx * fy).sum(1);
  std::cout << "[trig] worst |mean - exp(x.y)| = " << z << " standard errors\n";
  EXPECT_LE(z, 5.0);
  EXPECT_LE((feature_estimate - mean).abs().max().item<double>(), 1e-9);
}

TEST(TrigTest, ForwardEqualsTheMaskedQuadraticForm) {
  torch::manual_seed(1);
  const int64_t heads = 2, length = 21, d = 4;
  auto trig = MakeTrig(heads, d, "{num_features: 64, chunk_size: 5}");
  trig->to(torch::kFloat64);
  const auto q = 0.5 * torch::randn({1, heads, length, d}, torch::kFloat64);
  const auto k = 0.5 * torch::randn({1, heads, length, d}, torch::kFloat64);
  const auto v = torch::randn({1, heads, length, d}, torch::kFloat64);
  AttentionCall call;
  call.scale = 1.0;
  for (const bool causal : {true, false}) {
    call.causal = causal;
    const auto out = trig->forward(q, k, v, call);
    const auto phi_q = trig->SignedFeatures(q) * (0.5 * q.pow(2).sum(-1, true)).exp();
    const auto phi_k = trig->SignedFeatures(k) * (0.5 * k.pow(2).sum(-1, true)).exp();
    auto a = torch::matmul(phi_q, phi_k.transpose(-1, -2));
    if (causal) a = a.tril();
    const auto reference = torch::matmul(a, v) / a.sum(-1, true);
    const double err = ((out - reference).abs().max() / reference.abs().max()).item<double>();
    std::cout << "[trig] " << (causal ? "causal" : "non-causal") << " vs quadratic form: " << err << "\n";
    EXPECT_LE(err, 1e-10);
  }
}

TEST(TrigTest, SignedNormalisersStayFinite) {
  // One feature: phi(x).phi(y) = exp(.) cos(w.(x - y)) is negative for half the pairs and zero
  // when w.(x - y) = pi/2. Outputs and gradients must stay finite (no NaN, no inf).
  torch::manual_seed(2);
  const int64_t heads = 1, length = 30, d = 2;
  auto trig = MakeTrig(heads, d, "{num_features: 1, chunk_size: 4, projection: iid}");
  const auto w = trig->projection()[0];
  auto q = torch::randn({1, heads, length, d}), k = torch::randn({1, heads, length, d});
  {
    // Position 0 attends only to itself: set q_0 - k_0 so that w.(q_0 - k_0) = pi/2 exactly-ish.
    torch::NoGradGuard no_grad;
    q[0][0][0] = k[0][0][0] + (M_PI / 2) * w / w.pow(2).sum();
  }
  q.requires_grad_(true);
  k.requires_grad_(true);
  auto v = torch::randn({1, heads, length, d}).requires_grad_(true);
  AttentionCall call;
  call.scale = 1.0;
  const auto out = trig->forward(q, k, v, call);
  out.pow(2).sum().backward();
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(q.grad()).all().item<bool>() && torch::isfinite(k.grad()).all().item<bool>() &&
              torch::isfinite(v.grad()).all().item<bool>());
  std::cout << "[trig] one feature: output at the zero normaliser " << out[0][0][0] << "\n";
}

TEST(TrigTest, GradientsMatchFiniteDifferencesInFloat64) {
  torch::manual_seed(3);
  const int64_t heads = 2, length = 6, d = 3;
  auto trig = MakeTrig(heads, d, "{num_features: 8, chunk_size: 4, projection: iid}");
  trig->to(torch::kFloat64);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  auto q = (0.5 * torch::randn({1, heads, length, d}, f64)).requires_grad_();
  auto k = (0.5 * torch::randn({1, heads, length, d}, f64)).requires_grad_();
  auto v = torch::randn({1, heads, length, d}, f64).requires_grad_();
  const auto weights = torch::randn({1, heads, length, d}, f64);
  AttentionCall call;
  call.scale = 0.7;
  auto loss = [&] { return (trig->forward(q, k, v, call) * weights).sum(); };
  const double worst = testing::MaxGradientError(loss, {q, k, v});
  std::cout << "[trig] finite differences: worst relative gradient error " << worst << "\n";
  EXPECT_LE(worst, 1e-6);
}

TEST(TrigTest, OptionsAreChecked) {
  try {
    MakeTrig(1, 4, "{normaliser_floor: 0}");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention.trig.normaliser_floor"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace darkformer
