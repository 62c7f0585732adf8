// The causal operator's forms (ops/feature_map.h), each test once per `op` (the fixture of
// fused_causal_test_util.h): causality and prefix invariance, the bytes autograd saves, and the
// recurrent step against the parallel form.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "attention/fused_causal_attention.h"
#include "attention/fused_causal_test_util.h"
#include "attention/log_feature_kernel.h"

namespace darkformer {
namespace {

using namespace fused_causal_test;

TEST_P(FusedCausalAttentionTest, LaterKeysNeverTouchEarlierOutputs) {
  torch::manual_seed(7);
  const int64_t heads = 4, kv = 1, length = 50, t = 20, d = 8;
  const auto q = torch::randn({1, heads, length, d}), k = torch::randn({1, kv, length, d}),
             v = torch::randn({1, kv, length, d});
  auto k2 = k.clone(), v2 = v.clone();
  k2.narrow(2, t + 1, length - t - 1).mul_(200.0);  // keys after t with huge norms
  v2.narrow(2, t + 1, length - t - 1).normal_();
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (const auto& name : kFeatureKernels) {
    auto kernel = Make(name, heads, d, 32, 16, op());
    const auto a = kernel->forward(q, k, v, call), b = kernel->forward(q, k2, v2, call);
    EXPECT_EQ((a.narrow(2, 0, t + 1) - b.narrow(2, 0, t + 1)).abs().max().item<double>(), 0.0) << name;
    EXPECT_TRUE(torch::isfinite(b).all().item<bool>()) << name;
  }
}

// Prefix invariance: new tokens after t (queries, keys with huge norms, values) leave every output
// at positions <= t bit-identical, in every chunk (t inside a chunk, so later keys share it).
TEST_P(FusedCausalAttentionTest, NewTokensAfterTLeaveEarlierOutputsBitIdentical) {
  torch::manual_seed(8);
  const int64_t heads = 4, kv = 2, length = 45, t = 21, d = 8;
  const auto q = torch::randn({2, heads, length, d}), k = torch::randn({2, kv, length, d}),
             v = torch::randn({2, kv, length, d});
  auto q2 = q.clone(), k2 = k.clone(), v2 = v.clone();
  q2.narrow(2, t + 1, length - t - 1).normal_().mul_(30.0);
  k2.narrow(2, t + 1, length - t - 1).normal_().mul_(30.0);
  v2.narrow(2, t + 1, length - t - 1).normal_();
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (const auto& name : kFeatureKernels) {
    auto kernel = Make(name, heads, d, 32, 16, op());
    const auto a = kernel->forward(q, k, v, call), b = kernel->forward(q2, k2, v2, call);
    EXPECT_EQ((a.narrow(2, 0, t + 1) - b.narrow(2, 0, t + 1)).abs().max().item<double>(), 0.0) << name;
    EXPECT_GT((a.narrow(2, t + 1, 1) - b.narrow(2, t + 1, 1)).abs().max().item<double>(), 1e-3) << name;
    EXPECT_TRUE(torch::isfinite(b).all().item<bool>()) << name;
  }
}

// Autograd keeps O(L D) bytes (x, y, v, output, normaliser), never O(L m) features.
TEST_P(FusedCausalAttentionTest, SavedTensorsGrowWithLTimesDNotLTimesM) {
  const int64_t heads = 2, d = 16;
  auto saved = [&](int64_t length, int64_t m) {
    torch::manual_seed(1);
    auto kernel = Make("darkformer", heads, d, m, 64, op());
    const auto q = torch::randn({1, heads, length, d}, torch::requires_grad()),
               k = torch::randn({1, heads, length, d}, torch::requires_grad()),
               v = torch::randn({1, heads, length, d}, torch::requires_grad());
    AttentionCall call;
    const auto out = FusedCausalLinearAttention(q, k, v, std::dynamic_pointer_cast<LogFeatureKernel>(kernel.ptr())->MakeFeatureMap(), 64);
    return FusedCausalSavedBytes(out);
  };
  const int64_t length = 2048;
  const int64_t small_m = saved(length, 16), large_m = saved(length, 1024), double_l = saved(2 * length, 1024);
  const int64_t one_feature_tensor = int64_t{heads} * length * 1024 * 4;
  std::cout << "[saved bytes] L=2048 m=16: " << small_m << ", m=1024: " << large_m << ", L=4096 m=1024: " << double_l
            << " (one L x m feature tensor: " << one_feature_tensor << ")\n";
  EXPECT_GT(small_m, 0);
  // m only adds the draw W (m x d) and nothing per position.
  EXPECT_EQ(large_m - small_m, (1024 - 16) * d * 4);
  EXPECT_LT(large_m, one_feature_tensor / 4);
  const double per_position = static_cast<double>(double_l - large_m) / length;
  EXPECT_NEAR(per_position, static_cast<double>(large_m - 1024 * d * 4 - heads * d * d * 4) / length, 1.0);
}

// Positive features (performer here; darkformer and lfk take the same path) through the kernel's
// own forward: on the raw CPU kernel the backward also reads checkpoints of the state and its
// per-feature reference, V + 1 = d + 2 floats per position and key row whatever m
// (raw_cpu_kernel.h). Per position: x, y, v and the output (d floats per head each; op: cuda
// recomputes the output instead), the normaliser (per head) and the checkpoints; the draw W is the
// only term that grows with m.
TEST_P(FusedCausalAttentionTest, SavedTensorsOfPositiveFeaturesStayOLTimesD) {
  const int64_t heads = 2, d = 16, chunk = 64;
  auto saved = [&](int64_t length, int64_t m) {
    torch::manual_seed(1);
    auto kernel = Make("performer", heads, d, m, chunk, op());
    const auto q = torch::randn({1, heads, length, d}, torch::requires_grad()),
               k = torch::randn({1, heads, length, d}, torch::requires_grad()),
               v = torch::randn({1, heads, length, d}, torch::requires_grad());
    AttentionCall call;
    return FusedCausalSavedBytes(kernel->forward(q, k, v, call));
  };
  const int64_t length = 2048;
  for (const int64_t m : {16, 256, 1024}) {
    const int64_t at_l = saved(length, m), at_2l = saved(2 * length, m);
    const double per_position = static_cast<double>(at_2l - at_l) / length;
    const double budget = 4.0 * (heads * (4 * d + 1) + heads * (d + 2));
    std::cout << "[saved bytes, positive features] m=" << m << ": " << per_position << " per position (budget "
              << budget << ", an L x m feature tensor: " << 4 * heads * m << ")\n";
    const int64_t per_head = op() == "cuda" ? 3 : 4;  // x, y, v and (but for op: cuda) the output at least
    EXPECT_GT(at_l, per_head * heads * length * 4 * d) << m;
    EXPECT_LE(per_position, budget) << m;
  }
}

TEST_P(FusedCausalAttentionTest, RecurrentStepsEqualTheParallelForm) {
  torch::manual_seed(9);
  const int64_t heads = 4, kv = 2, length = 23, prefill = 9, d = 8;
  const auto x = torch::randn({1, heads, length, d}), y = torch::randn({1, kv, length, d}) * 2,
             v = torch::randn({1, kv, length, d});
  for (const auto& name : kFeatureKernels) {
    auto kernel = Make(name, heads, d, 16, 4, op());
    const auto map = std::dynamic_pointer_cast<LogFeatureKernel>(kernel.ptr())->MakeFeatureMap();
    torch::NoGradGuard no_grad;
    const auto full = FusedCausalLinearAttention(x, y, v, map, 4);
    // From scratch, one token at a time.
    LinearAttentionState state;
    for (int64_t t = 0; t < length; ++t) {
      const auto out = LinearAttentionStep(state, x.narrow(2, t, 1), y.narrow(2, t, 1), v.narrow(2, t, 1), map);
      EXPECT_LE(RelativeError(out, full.narrow(2, t, 1)), 1e-5) << name << " t=" << t;
    }
    // Prefill with the chunked path, then steps.
    auto prefilled = LinearAttentionPrefillState(y.narrow(2, 0, prefill), v.narrow(2, 0, prefill), map, heads, 4);
    EXPECT_EQ(prefilled.tokens, prefill);
    for (int64_t t = prefill; t < length; ++t) {
      const auto out = LinearAttentionStep(prefilled, x.narrow(2, t, 1), y.narrow(2, t, 1), v.narrow(2, t, 1), map);
      EXPECT_LE(RelativeError(out, full.narrow(2, t, 1)), 1e-5) << name << " t=" << t;
    }
  }
}

}  // namespace
}  // namespace darkformer
