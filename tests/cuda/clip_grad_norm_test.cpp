// Clipping by the global 2-norm (train/clip_grad_norm.h) against the norm and the scaled
// gradients computed in fp64 from the same gradients: within the roundings fp32 arithmetic can
// commit, counted below, whatever order the multi-tensor kernel sums in (the CPU's per-tensor
// norms, CUDA's blocks). On the test device (cuda/test_device.h) too.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cuda/test_device.h"
#include "train/clip_grad_norm.h"

namespace darkformer {
namespace {

constexpr double kU = 0x1p-24;  // fp32's unit roundoff

struct Case {
  std::vector<torch::Tensor> parameters;  // on the test device, gradients set where `grads` has one
  std::vector<torch::Tensor> grads;       // fp64 copies of the gradients, on the CPU
  int64_t largest = 0;                    // elements in the largest gradient
};

// Gradients over many scales, one of them zero, and a parameter without a gradient.
Case MakeCase(torch::ScalarType dtype) {
  torch::manual_seed(11);
  const auto on = torch::TensorOptions().device(testing::TestDevice()).dtype(dtype);
  Case c;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{1003}, {37, 29}, {1}, {8}}) {
    auto g = torch::randn(shape) * torch::exp(torch::randn(shape) * 3);
    if (shape == std::vector<int64_t>{8}) g.zero_();
    auto p = torch::zeros(shape, on);
    p.mutable_grad() = g.to(on);
    c.parameters.push_back(p);
    c.grads.push_back(p.grad().cpu().to(torch::kFloat64));  // the values the clip sees
    c.largest = std::max(c.largest, g.numel());
  }
  c.parameters.push_back(torch::zeros({5}, on));  // no gradient: not counted, not touched
  return c;
}

double Fp64Norm(const Case& c) {
  double sum = 0.0;
  for (const auto& g : c.grads) sum += g.square().sum().item<double>();
  return std::sqrt(sum);
}

// Each gradient's squares (1 rounding each) summed in any order (n - 1), its root (half of that,
// plus 1); the norms squared (twice the norm's, plus 1), summed (P - 1), the root: relative to the
// norm, at most (n + P + 4) u to first order, n the largest gradient's elements, P the norms.
double NormBound(const Case& c) { return (c.largest + static_cast<double>(c.grads.size()) + 4) * kU; }

TEST(ClipGradNorm, NormIsTheGlobalTwoNormWithinItsRoundings) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    auto c = MakeCase(dtype);
    const auto norm = ClipGradNorm(c.parameters, std::numeric_limits<double>::infinity());
    EXPECT_EQ(norm.scalar_type(), torch::kFloat) << "bf16 gradients' norm is summed in fp32";
    EXPECT_EQ(norm.device(), testing::TestDevice());
    const double want = Fp64Norm(c);
    EXPECT_LE(std::abs(norm.item<double>() - want), NormBound(c) * want) << torch::toString(dtype);
    // max_norm = inf scales nothing.
    for (size_t i = 0; i < c.grads.size(); ++i) {
      EXPECT_TRUE(torch::equal(c.parameters[i].grad().cpu().to(torch::kFloat64), c.grads[i])) << i;
    }
    EXPECT_FALSE(c.parameters.back().grad().defined());
  }
}

TEST(ClipGradNorm, ScalesEveryGradientByMaxOverNormWithinItsRoundings) {
  auto c = MakeCase(torch::kFloat);
  const double norm = Fp64Norm(c), max_norm = norm / 4;
  const double returned = ClipGradNorm(c.parameters, max_norm).item<double>();
  EXPECT_LE(std::abs(returned - norm), NormBound(c) * norm) << "the norm before clipping";
  // The scale max / (norm + 1e-6) carries the norm's error, max's rounding to fp32, the sum's and
  // the division's; the product rounds once more.
  const double scale = max_norm / (norm + 1e-6), bound = NormBound(c) + 4 * kU;
  for (size_t i = 0; i < c.grads.size(); ++i) {
    const auto want = c.grads[i] * scale;
    const auto got = c.parameters[i].grad().cpu().to(torch::kFloat64);
    EXPECT_TRUE(((got - want).abs() <= bound * want.abs()).all().item<bool>()) << "gradient " << i;
  }
  EXPECT_FALSE(c.parameters.back().grad().defined());
}

TEST(ClipGradNorm, AGradientWithinTheMaxKeepsItsBits) {
  auto c = MakeCase(torch::kFloat);
  ClipGradNorm(c.parameters, 4 * Fp64Norm(c));  // the scale clamps to exactly 1
  for (size_t i = 0; i < c.grads.size(); ++i) {
    EXPECT_TRUE(torch::equal(c.parameters[i].grad().cpu().to(torch::kFloat64), c.grads[i])) << i;
  }
}

TEST(ClipGradNorm, ANonFiniteGradientGivesANonFiniteNorm) {
  for (const double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    auto c = MakeCase(torch::kFloat);
    c.parameters[1].grad().view(-1)[3].fill_(bad);
    const double norm = ClipGradNorm(c.parameters, 1.0).item<double>();
    EXPECT_FALSE(std::isfinite(norm)) << bad;
  }
}

TEST(ClipGradNorm, NoGradientsGiveZero) {
  const auto p = torch::ones({3}, torch::TensorOptions().device(testing::TestDevice()));
  EXPECT_EQ(ClipGradNorm({p}, 1.0).item<double>(), 0.0);
  EXPECT_EQ(ClipGradNorm({}, 1.0).item<double>(), 0.0);
}

}  // namespace
}  // namespace darkformer
