// The fused AdamW (train/fused_adamw.h) against AdamW's update computed in fp64 from the same
// parameter, gradient and moments: every element within the roundings its fp32 arithmetic can
// commit, counted below, at the first step (fresh moments) and at a later one (moments and step
// count given, the bias corrections then differ), with and without weight decay; LibTorch's own
// torch::optim::AdamW is held to the same bound, which shows the bound is AdamW's and not the
// kernel's. A parameter without a gradient keeps its bits and gets no state. On the test device
// (cuda/test_device.h): CUDA's fused kernel is another kernel, held to the same count.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cuda/test_device.h"
#include "train/fused_adamw.h"

namespace darkformer {
namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

constexpr double kLr = 3e-2, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
constexpr double kU = 0x1p-24;  // fp32's unit roundoff
constexpr int64_t kN = 1003;     // not a multiple of any vector width: the scalar tail runs too

struct State {
  torch::Tensor p, g, m, v;  // fp32
};

State MakeState(int64_t seed) {
  torch::manual_seed(seed);
  State s;
  s.p = torch::randn({kN});
  s.g = torch::randn({kN}) * torch::exp(torch::randn({kN}) * 3);  // gradients over many scales
  s.g.narrow(0, 0, 5).zero_();                                      // some exactly zero
  s.m = torch::randn({kN}) * 0.1;
  s.v = torch::randn({kN}).square() * 0.01;
  s.v.narrow(0, 0, 3).zero_();  // zero second moment and zero gradient: the denominator is eps
  return s;
}

// One step of `optimizer` on a copy of the state, as step `step` (moments given where step > 1).
State Step(const std::string& which, const State& in, int64_t step, double weight_decay) {
  const auto device = testing::TestDevice();
  auto p = in.p.to(device, /*non_blocking=*/false, /*copy=*/true);
  p.mutable_grad() = in.g.to(device, /*non_blocking=*/false, /*copy=*/true);
  const auto options = AdamWOptions(kLr).betas({kBeta1, kBeta2}).eps(kEps).weight_decay(weight_decay);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p}, std::make_unique<AdamWOptions>(options));
  std::unique_ptr<torch::optim::AdamW> optimizer;
  if (which == "fused") optimizer = std::make_unique<FusedAdamW>(groups, options);
  if (which == "libtorch") optimizer = std::make_unique<torch::optim::AdamW>(groups, options);
  if (step > 1) {
    auto state = std::make_unique<AdamWParamState>();
    state->step(step - 1);
    state->exp_avg(in.m.to(device, /*non_blocking=*/false, /*copy=*/true));
    state->exp_avg_sq(in.v.to(device, /*non_blocking=*/false, /*copy=*/true));
    optimizer->state()[p.unsafeGetTensorImpl()] = std::move(state);
  }
  optimizer->step();
  const auto& state = static_cast<const AdamWParamState&>(*optimizer->state().at(p.unsafeGetTensorImpl()));
  EXPECT_EQ(state.step(), step) << which;
  return {p.detach().cpu(), in.g, state.exp_avg().cpu(), state.exp_avg_sq().cpu()};
}

void ExpectWithinAdamWsRoundings(const std::string& which, int64_t step, double weight_decay) {
  const auto in = MakeState(step);
  const auto got = Step(which, in, step, weight_decay);
  const auto f64 = [](const torch::Tensor& t) { return t.to(torch::kFloat64); };
  const auto p = f64(in.p), g = f64(in.g);
  const auto m = step > 1 ? f64(in.m) : torch::zeros_like(p), v = step > 1 ? f64(in.v) : torch::zeros_like(p);
  // AdamW in fp64.
  const auto m_terms = kBeta1 * m.abs() + (1 - kBeta1) * g.abs();
  const auto v_new = kBeta2 * v + (1 - kBeta2) * g * g;
  const auto m_new = kBeta1 * m + (1 - kBeta1) * g;
  const double step_size = kLr / (1 - std::pow(kBeta1, static_cast<double>(step)));
  const double c2 = std::sqrt(1 - std::pow(kBeta2, static_cast<double>(step)));
  const auto denom = v_new.sqrt() / c2 + kEps;
  const auto update = step_size * m_new / denom;
  const auto p_new = p * (1 - kLr * weight_decay) - update;
  // The roundings of fp32 arithmetic, first order, each relative to the magnitude it rounds:
  // - the first moment: its constants (1), the difference or products (2), the sum (1), taken as
  //   5 on the terms' magnitudes;
  // - the second moment: its constants (2), g * g (1), the coefficient's product (1), the sum (1):
  //   5 relative (a sum of non-negative terms);
  // - the denominator: half the second moment's (2.5), the root (1), the correction and its
  //   division (2), eps and the sum (1): 6.5; the update's step size, product and division: 3 more,
  //   so 10 relative on the update, plus the first moment's error through step_size / denom;
  // - the parameter: the decay's constant and product, and the subtraction (3 on |p|, 1 on the
  //   result).
  const auto m_bound = 5 * kU * m_terms;
  const auto v_bound = 5 * kU * v_new;
  const auto p_bound = 3 * kU * p.abs() + kU * p_new.abs() + 10 * kU * update.abs() + step_size * m_bound / denom;
  const std::string where = which + " at step " + std::to_string(step) + ", weight decay " + std::to_string(weight_decay);
  EXPECT_TRUE(((f64(got.m) - m_new).abs() <= m_bound).all().item<bool>()) << where << ": first moment";
  EXPECT_TRUE(((f64(got.v) - v_new).abs() <= v_bound).all().item<bool>()) << where << ": second moment";
  const auto excess = ((f64(got.p) - p_new).abs() - p_bound).max().item<double>();
  EXPECT_LE(excess, 0.0) << where << ": parameter";
  // The step moved the parameters: a bound this size could not hide a skipped update.
  EXPECT_GT((update.abs() - p_bound).max().item<double>(), 0.0) << where;
}

TEST(FusedAdamW, OneStepIsAdamWsUpdateWithinItsRoundings) {
  for (const std::string which : {"fused", "libtorch"}) {
    for (const int64_t step : {1, 7}) {
      for (const double weight_decay : {0.0, 0.1}) ExpectWithinAdamWsRoundings(which, step, weight_decay);
    }
  }
}

// Parameters of one group at different step counts (one fresh, two at step 7, which share the
// kernel's step tensor): each takes the update it takes alone, bit for bit.
TEST(FusedAdamW, ParametersAtDifferentStepsInOneGroupEachTakeTheirOwnUpdate) {
  const auto device = testing::TestDevice();
  const std::vector<int64_t> steps = {1, 7, 7};
  std::vector<State> in;
  std::vector<torch::Tensor> params;
  for (size_t i = 0; i < steps.size(); ++i) {
    in.push_back(MakeState(static_cast<int64_t>(i) + 20));
    auto p = in[i].p.to(device, /*non_blocking=*/false, /*copy=*/true);
    p.mutable_grad() = in[i].g.to(device, /*non_blocking=*/false, /*copy=*/true);
    params.push_back(p);
  }
  const auto options = AdamWOptions(kLr).betas({kBeta1, kBeta2}).eps(kEps).weight_decay(0.1);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(params, std::make_unique<AdamWOptions>(options));
  FusedAdamW optimizer(groups, options);
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i] == 1) continue;
    auto state = std::make_unique<AdamWParamState>();
    state->step(steps[i] - 1);
    state->exp_avg(in[i].m.to(device, /*non_blocking=*/false, /*copy=*/true));
    state->exp_avg_sq(in[i].v.to(device, /*non_blocking=*/false, /*copy=*/true));
    optimizer.state()[params[i].unsafeGetTensorImpl()] = std::move(state);
  }
  optimizer.step();
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto alone = Step("fused", in[i], steps[i], 0.1);
    EXPECT_TRUE(torch::equal(params[i].detach().cpu(), alone.p)) << "parameter " << i << " at step " << steps[i];
  }
}

TEST(FusedAdamW, GroupsKeepTheirDecayAndAParameterWithoutAGradientIsLeftAlone) {
  const auto on = torch::TensorOptions().device(testing::TestDevice());
  auto decayed = torch::ones({4}, on), plain = torch::ones({4}, on), untouched = torch::ones({4}, on);
  decayed.mutable_grad() = torch::zeros({4}, on);
  plain.mutable_grad() = torch::zeros({4}, on);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{decayed}, std::make_unique<AdamWOptions>(AdamWOptions(0.5).weight_decay(0.2)));
  groups.emplace_back(std::vector<torch::Tensor>{plain, untouched}, std::make_unique<AdamWOptions>(AdamWOptions(0.5).weight_decay(0.0)));
  FusedAdamW optimizer(groups, AdamWOptions(0.5));
  optimizer.step();
  // A zero gradient leaves only the decay: 1 - lr * weight_decay, rounded once or twice.
  EXPECT_NEAR(decayed[0].item<double>(), 0.9, 2 * kU);
  EXPECT_TRUE(torch::equal(plain, torch::ones({4}, on)));
  EXPECT_TRUE(torch::equal(untouched, torch::ones({4}, on)));
  EXPECT_EQ(optimizer.state().count(untouched.unsafeGetTensorImpl()), 0u);
  EXPECT_EQ(optimizer.state().size(), 2u);
}

}  // namespace
}  // namespace darkformer
