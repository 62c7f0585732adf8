// Feature maps as kernel-check sees them (feature_kernel_base.h): each kernel's PairEstimate and
// EstimatorTarget equal the per-kernel formulas kernel-check used before they became virtuals;
// over independent draws PairEstimate's mean approaches EstimatorTarget; signed maps refuse
// `fused`, which log-form maps keep.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "attention/darkformer_kernel.h"
#include "attention/flexformer_kernel.h"
#include "attention/kernel_registry.h"
#include "attention/log_feature_kernel.h"
#include "attention/saderf_kernel.h"
#include "attention/derf_test_state.h"
#include "attention/slay_kernel.h"
#include "attention/trig_kernel.h"
#include "util/error.h"

namespace darkformer {
namespace {

struct MapCase {
  std::string name, yaml;
};

// Every feature kernel; darkformer per head and shared, both flexformer variants, sketched and
// exact slay.
const std::vector<MapCase> kMaps = {
    {"performer", "{num_features: 16}"},
    {"darkformer", "{num_features: 16}"},
    {"darkformer", "{num_features: 16, share_across_heads: true, rank: 3}"},
    {"lfk", "{num_features: 16}"},
    {"gerf", "{num_features: 16, a: -0.2}"},
    {"saderf", "{num_features: 16, a: -0.1}"},
    {"aderf", "{num_features: 16}"},
    {"sderf", "{num_features: 16}"},
    {"trig", "{num_features: 16}"},
    {"slay", "{num_features: 4}"},
    {"slay", "{num_features: 4, sketch_dim: 0}"},
    {"flexformer", "{num_features: 16}"},
    {"flexformer", "{num_features: 16, variant: nonstationary}"},
};

std::shared_ptr<FeatureKernelBase> Make(const MapCase& c, int64_t heads, int64_t d, int64_t seed = 0) {
  KernelShape shape;
  shape.num_heads = heads;
  shape.head_dim = d;
  auto node = YAML::Load(c.yaml);
  node["seed"] = seed;
  auto kernel = MakeAttentionKernel(c.name, shape, ConfigReader(node, "attention." + c.name));
  return std::dynamic_pointer_cast<FeatureKernelBase>(kernel.ptr());
}

// Moves darkformer's M and saderf's psi off the identity (the same values for every seed), so the
// targets and estimates see them.
void Perturb(FeatureKernelBase& kernel) {
  torch::NoGradGuard no_grad;
  PerturbDerf(kernel, 0.3, 17);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(17);
  if (auto dark = dynamic_cast<DarkformerKernelImpl*>(&kernel)) {
    dark->M.add_(0.3 * at::normal(0.0, 1.0, dark->M.sizes(), generator, torch::kFloat32));
  }
  if (auto saderf = dynamic_cast<SaderfKernelImpl*>(&kernel)) {
    auto psi = saderf->named_buffers()["psi"];
    psi.copy_((0.3 * at::normal(0.0, 1.0, psi.sizes(), generator, torch::kFloat32)).exp());
  }
}

// kernel-check's PairEstimate before this refactoring (dynamic_casts to the signed kernels).
torch::Tensor PreviousPairEstimate(const FeatureKernelBase& f, const torch::Tensor& x, const torch::Tensor& y) {
  if (auto trig = dynamic_cast<const TrigKernelImpl*>(&f)) {
    const auto scale = (0.5 * (x.pow(2).sum(-1) + y.pow(2).sum(-1))).exp();
    return scale * (trig->SignedFeatures(x) * trig->SignedFeatures(y)).sum(-1);
  }
  if (auto flex = dynamic_cast<const FlexformerKernelImpl*>(&f)) {
    return (flex->LogScale(x) + flex->LogScale(y)).exp() * (flex->FourierFeatures(x) * flex->FourierFeatures(y)).sum(-1);
  }
  if (auto slay = dynamic_cast<const SlayKernelImpl*>(&f)) return (slay->Features(x) * slay->Features(y)).sum(-1);
  const auto& log_form = dynamic_cast<const LogFeatureKernel&>(f);
  return torch::exp(log_form.LogFeatures(x) + log_form.LogFeatures(y, /*is_query=*/false)).sum(-1);
}

// kernel-check's target before this refactoring, for x_11PD, y_11PD: P values.
torch::Tensor PreviousTarget(const FeatureKernelBase& f, const torch::Tensor& x, const torch::Tensor& y) {
  auto y_target = y;
  if (auto dark = dynamic_cast<const DarkformerKernelImpl*>(&f)) {
    const auto m = dark->M[0];
    y_target = torch::matmul(y, m.t().mm(m));
  }
  auto target_P = torch::exp((x * y_target).sum(-1).flatten().to(torch::kFloat64));
  if (auto slay = dynamic_cast<const SlayKernelImpl*>(&f)) {
    const auto t = (x / x.norm(2, -1, true) * (y / y.norm(2, -1, true))).sum(-1).flatten();
    target_P = YatQuadrature(t, slay->epsilon(), slay->nodes());
  }
  return target_P;
}

TEST(FeatureMapTest, PairEstimateAndTargetEqualThePreviousFormulas) {
  torch::manual_seed(3);
  const int64_t heads = 3, pairs = 5, d = 6;
  torch::NoGradGuard no_grad;
  for (const auto& c : kMaps) {
    auto kernel = Make(c, heads, d);
    Perturb(*kernel);
    const auto x = 0.4 * torch::randn({1, 1, pairs, d}), y = 0.4 * torch::randn({1, 1, pairs, d});
    const auto x_h = x.expand({1, heads, pairs, d}), y_h = y.expand({1, heads, pairs, d});
    const std::string where = c.name + " " + c.yaml;
    EXPECT_TRUE(torch::equal(kernel->PairEstimate(x_h, y_h), PreviousPairEstimate(*kernel, x_h, y_h))) << where;
    const auto target_P = PreviousTarget(*kernel, x, y);
    const auto target_11P = kernel->EstimatorTarget(x, y);
    EXPECT_EQ(target_11P.scalar_type(), torch::kFloat64) << where;
    EXPECT_TRUE(torch::equal(target_11P.flatten(), target_P)) << where;
    // Every head gets head 0's target.
    const auto target_1HP = kernel->EstimatorTarget(x_h, y_h);
    ASSERT_EQ(target_1HP.sizes(), torch::IntArrayRef({1, heads, pairs})) << where;
    for (int64_t h = 0; h < heads; ++h) EXPECT_TRUE(torch::allclose(target_1HP[0][h], target_P)) << where << " head " << h;
  }
}

// The estimator is unbiased: the mean over independent draws of PairEstimate is within a few
// standard errors of EstimatorTarget for each pair (trig: exp(x.y); darkformer: exp(x^T M^T M y)
// with its M, exp(x^T M^T y) with M on the queries only; slay: the Yat quadrature).
TEST(FeatureMapTest, PairEstimateMeanOverDrawsApproachesTheTarget) {
  torch::manual_seed(4);
  const int64_t heads = 2, pairs = 4, d = 4, draws = 400;
  torch::NoGradGuard no_grad;
  const auto x = 0.3 * torch::randn({1, 1, pairs, d}), y = 0.3 * torch::randn({1, 1, pairs, d});
  const auto x_h = x.expand({1, heads, pairs, d}), y_h = y.expand({1, heads, pairs, d});
  // Besides kMaps: darkformer's M on the queries only, unbiased for exp(x^T M^T y).
  auto maps = kMaps;
  maps.push_back({"darkformer", "{num_features: 16, apply_to: queries}"});
  for (auto c : maps) {
    // One node: with slay's default 3 the largest exponent makes the products log-normal with
    // sigma ~5, and their sample variance no usable error bar (slay_kernel_test.cpp).
    if (c.name == "slay") c.yaml = c.yaml.substr(0, c.yaml.size() - 1) + ", nodes: 1}";
    std::vector<torch::Tensor> estimates;
    torch::Tensor target_P;
    for (int64_t seed = 1; seed <= draws; ++seed) {
      auto kernel = Make(c, heads, d, seed);
      Perturb(*kernel);
      if (!target_P.defined()) target_P = kernel->EstimatorTarget(x, y).flatten();
      estimates.push_back(kernel->PairEstimate(x_h, y_h)[0][0].to(torch::kFloat64));
    }
    const auto est_NP = torch::stack(estimates);
    const auto se_P = est_NP.std(0) / std::sqrt(static_cast<double>(draws));
    const double z = ((est_NP.mean(0) - target_P).abs() / se_P.clamp_min(1e-12)).max().item<double>();
    std::cout << "[feature map] " << c.name << " " << c.yaml << ": worst |mean - target| = " << z
              << " standard errors\n";
    EXPECT_LE(z, 5.0) << c.name << " " << c.yaml;
  }
}

// target: softmax: darkformer's draws from N(0, M^T M), importance-weighted, are unbiased for
// exp(x.y) itself and not for the metric's exp(x^T M^T M y). M = R diag(s) R^T is a fixed
// anisotropic map whose Sigma has eigenvalues s^2 in [0.64, 1.69], above the 1/2 that keeps the
// weighted features' variance finite, so the sample variance gives a usable error bar. Two pairs
// lie along Sigma's extreme eigenvectors (x = y = 0.6 e: exp(0.36) against exp(0.61) and
// exp(0.23)), two are random: the metric is then tens of standard errors away, so the second
// check has power.
TEST(FeatureMapTest, ImportanceWeightedDrawsAreUnbiasedForTheSoftmaxKernel) {
  torch::manual_seed(5);
  const int64_t d = 4, draws = 400;
  torch::NoGradGuard no_grad;
  const auto rotation_DD = std::get<0>(torch::linalg_qr(torch::randn({d, d})));
  const auto m_DD = torch::matmul(rotation_DD * torch::tensor({0.8, 1.3, 1.0, 1.2}, torch::kFloat32), rotation_DD.t());
  const auto extremes_2D = 0.6 * rotation_DD.narrow(1, 0, 2).t();  // s = 0.8 and 1.3
  const auto x = torch::cat({extremes_2D, 0.4 * torch::randn({2, d})}).view({1, 1, 4, d});
  const auto y = torch::cat({extremes_2D, 0.4 * torch::randn({2, d})}).view({1, 1, 4, d});
  std::vector<torch::Tensor> estimates;
  for (int64_t seed = 1; seed <= draws; ++seed) {
    auto kernel = Make({"darkformer", "{num_features: 16, target: softmax}"}, 1, d, seed);
    dynamic_cast<DarkformerKernelImpl&>(*kernel).M[0].copy_(m_DD);
    estimates.push_back(kernel->PairEstimate(x, y)[0][0].to(torch::kFloat64));
  }
  const auto est_NP = torch::stack(estimates);
  const auto se_P = est_NP.std(0) / std::sqrt(static_cast<double>(draws));
  const auto z = [&](const torch::Tensor& target_P) {
    return ((est_NP.mean(0) - target_P).abs() / se_P).max().item<double>();
  };
  const auto x64 = x.to(torch::kFloat64).flatten(0, 2), y64 = y.to(torch::kFloat64).flatten(0, 2);
  const auto sigma = torch::matmul(m_DD.t(), m_DD).to(torch::kFloat64);
  const double z_softmax = z((x64 * y64).sum(-1).exp());
  const double z_metric = z((torch::matmul(x64, sigma) * y64).sum(-1).exp());
  std::cout << "[feature map] importance-weighted darkformer: worst |mean - exp(x.y)| = " << z_softmax
            << " standard errors; against exp(x^T Sigma y): " << z_metric << "\n";
  EXPECT_LE(z_softmax, 5.0);
  EXPECT_GT(z_metric, 5.0);
}

// Signed maps have one composite path: `op` (and the old `fused`) are unknown keys there. Log-form
// maps take `op`, read the old `fused: true|false` as auto|naive, and refuse both at once.
TEST(FeatureMapTest, SignedMapsRefuseOpAndLogFormMapsTakeIt) {
  for (const std::string name : {"trig", "slay", "flexformer"}) {
    for (const std::string key : {"fused: true", "fused: false", "op: naive", "op: chunk_parallel"}) {
      const std::string culprit = key.substr(0, key.find(':'));
      try {
        Make({name, "{num_features: 4, " + key + "}"}, 1, 4);
        ADD_FAILURE() << name << ": " << key << " accepted";
      } catch (const Error& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("unknown config key 'attention." + name + "." + culprit + "'"), std::string::npos)
            << message;
      }
    }
  }
  for (const std::string name : {"performer", "darkformer", "lfk", "gerf", "saderf", "aderf", "sderf"}) {
    EXPECT_EQ(Make({name, "{num_features: 4}"}, 1, 4)->options().op, CausalOp::kAuto) << name;
    EXPECT_EQ(Make({name, "{num_features: 4, fused: false}"}, 1, 4)->options().op, CausalOp::kNaive) << name;
    EXPECT_EQ(Make({name, "{num_features: 4, fused: true}"}, 1, 4)->options().op, CausalOp::kAuto) << name;
    EXPECT_EQ(Make({name, "{num_features: 4, op: chunk_parallel}"}, 1, 4)->options().op, CausalOp::kChunkParallel);
    for (const std::string bad : {"{num_features: 4, op: fast}", "{num_features: 4, op: naive, fused: true}"}) {
      try {
        Make({name, bad}, 1, 4);
        ADD_FAILURE() << name << ": " << bad << " accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("attention." + name + ".op"), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace darkformer
