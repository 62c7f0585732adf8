// Flexformer (004): at initialisation both variants are the trigonometric estimator of exp(x.y)
// (unbiased over draws); the causal path equals its masked quadratic form; fp64 finite differences
// reach the trainable frequencies and temperature; a trained temperature changes the kernel.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "attention/flexformer_kernel.h"
#include "attention/finite_difference.h"
#include "attention/kernel_registry.h"

namespace darkformer {
namespace {

std::shared_ptr<FlexformerKernelImpl> MakeFlex(int64_t heads, int64_t d, const std::string& yaml) {
  KernelShape shape;
  shape.num_heads = heads;
  shape.head_dim = d;
  auto kernel = MakeAttentionKernel("flexformer", shape, ConfigReader(YAML::Load(yaml), "attention.flexformer"));
  return std::dynamic_pointer_cast<FlexformerKernelImpl>(kernel.ptr());
}

TEST(FlexformerTest, AtInitialisationBothVariantsEstimateTheSoftmaxKernel) {
  torch::manual_seed(0);
  const int64_t d = 6, n = 200000;
  const auto x = 0.3 * torch::randn({1, 1, 5, d}, torch::kFloat64), y = 0.3 * torch::randn({1, 1, 5, d}, torch::kFloat64);
  const auto target = (x * y).sum(-1).exp()[0][0];
  torch::Tensor stationary_estimate;
  for (const std::string variant : {"stationary", "nonstationary"}) {
    auto flex = MakeFlex(1, d, "{num_features: 200000, projection: iid, variant: " + variant + "}");
    flex->to(torch::kFloat64);
    torch::NoGradGuard no_grad;
    // phi(x).phi(y) with the exp(|.|^2 / exp(tau)) factors; per-frequency terms for the error bar.
    const auto fx = flex->FourierFeatures(x)[0][0], fy = flex->FourierFeatures(y)[0][0];
    const auto scale = (flex->LogScale(x) + flex->LogScale(y)).exp()[0][0];
    const auto terms = scale.unsqueeze(1) * (fx.narrow(1, 0, n) * fy.narrow(1, 0, n) + fx.narrow(1, n, n) * fy.narrow(1, n, n)) * n;
    const auto estimate = scale * (fx * fy).sum(-1);
    const double z = ((estimate - target).abs() / (terms.var(1) / n).sqrt()).max().item<double>();
    std::cout << "[flexformer] " << variant << " at init: worst |estimate - exp(x.y)| = " << z << " standard errors\n";
    EXPECT_LE(z, 5.0) << variant;
    if (variant == "stationary") {
      stationary_estimate = estimate;
    } else {
      // W1 = W2 at init: W2' = 0, so the nonstationary features are the stationary ones.
      EXPECT_LE((estimate - stationary_estimate).abs().max().item<double>(), 1e-12);
    }
  }
}

TEST(FlexformerTest, ForwardEqualsQuadraticFormAndGradientsReachFrequenciesAndTau) {
  torch::manual_seed(1);
  const int64_t heads = 2, length = 7, d = 3;
  for (const std::string variant : {"stationary", "nonstationary"}) {
    auto flex = MakeFlex(heads, d, "{num_features: 4, chunk_size: 3, projection: iid, variant: " + variant + "}");
    flex->to(torch::kFloat64);
    {
      torch::NoGradGuard no_grad;  // away from the initial symmetric state
      flex->frequencies.add_(0.3 * torch::randn_like(flex->frequencies));
      flex->tau.add_(0.2 * torch::randn_like(flex->tau));
    }
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    auto q = (0.6 * torch::randn({1, heads, length, d}, f64)).requires_grad_();
    auto k = (0.6 * torch::randn({1, heads, length, d}, f64)).requires_grad_();
    auto v = torch::randn({1, heads, length, d}, f64).requires_grad_();
    AttentionCall call;
    call.scale = 1.0;
    {
      torch::NoGradGuard no_grad;
      const auto phi_q = flex->FourierFeatures(q) * flex->LogScale(q).exp().unsqueeze(-1);
      const auto phi_k = flex->FourierFeatures(k) * flex->LogScale(k).exp().unsqueeze(-1);
      const auto a = torch::matmul(phi_q, phi_k.transpose(-1, -2)).tril();
      const auto reference = torch::matmul(a, v) / a.sum(-1, true);
      const double err = ((flex->forward(q, k, v, call) - reference).abs().max() / reference.abs().max()).item<double>();
      std::cout << "[flexformer] " << variant << " causal vs quadratic form: " << err << "\n";
      EXPECT_LE(err, 1e-10) << variant;
    }
    const auto weights = torch::randn({1, heads, length, d}, f64);
    auto loss = [&] { return (flex->forward(q, k, v, call) * weights).sum(); };
    for (auto& p : flex->parameters()) p.mutable_grad() = torch::Tensor();
    const double worst = testing::MaxGradientError(loss, {q, k, v, flex->frequencies, flex->tau});
    ASSERT_TRUE(flex->tau.grad().defined()) << variant;
    std::cout << "[flexformer] " << variant << " finite differences (q, k, v, frequencies, tau): worst " << worst << "\n";
    EXPECT_LE(worst, 1e-6) << variant;
    EXPECT_GT(flex->tau.grad().abs().max().item<double>(), 0.0) << variant;  // tau is trained
  }
}

TEST(FlexformerTest, OptionsAreChecked) {
  for (const std::string yaml : {"{variant: spectral}", "{redraw: every_step}", "{normaliser_floor: -1}"}) {
    try {
      MakeFlex(1, 4, yaml);
      ADD_FAILURE() << yaml << ": no error";
    } catch (const Error& e) {
      const auto key = YAML::Load(yaml).begin()->first.as<std::string>();
      EXPECT_NE(std::string(e.what()).find("attention.flexformer." + key), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace darkformer
