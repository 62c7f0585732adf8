// The rule a bf16-autocast run keeps against its fp32 twin (the same config, steps and data), on
// the CPU (mixed_precision_test.cpp, where the bounds were measured) and on the GPU (tests/cuda/).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "attention/fused_causal_attention.h"

namespace darkformer::testing {

// fp32 and bf16: the two runs' losses, step by step.
inline void ExpectBf16TracksFp32(const std::vector<double>& fp32, const std::vector<double>& bf16,
                                 const std::string& what) {
  ASSERT_FALSE(fp32.empty()) << what;
  ASSERT_EQ(bf16.size(), fp32.size()) << what;
  double worst = 0.0;
  bool differs = false;
  for (size_t i = 0; i < fp32.size(); ++i) {
    ASSERT_TRUE(std::isfinite(bf16[i])) << what << ": step " << i + 1;
    worst = std::max(worst, std::abs(bf16[i] - fp32[i]) / fp32[i]);
    differs = differs || bf16[i] != fp32[i];
  }
  const double first = std::abs(bf16[0] - fp32[0]) / fp32[0];
  std::printf("[bf16 vs fp32] %s: relative loss gap at step 1 %.5f, worst over %zu steps %.4f; last step: %.5f vs %.5f\n",
              what.c_str(), first, fp32.size(), worst, bf16.back(), fp32.back());
  if (std::getenv("DARKFORMER_PRINT_LOSSES")) {
    for (size_t i = 0; i < fp32.size(); ++i) std::printf("  step %zu: %.5f vs %.5f\n", i + 1, bf16[i], fp32[i]);
  }
  // Step 1 runs identical weights: the gap is forward rounding only. bf16 keeps 8 significant
  // bits (unit roundoff 2^-9 = 0.2 %); the loss averages many rounded values, so one roundoff
  // bounds it (measured: < 1e-5 for most kernels, 8e-4 for slay, whose signed degree-2 features
  // amplify q and k's rounding).
  EXPECT_LT(first, 2e-3) << what;
  // After that Adam amplifies rounding (sign-like updates of small gradients) and the two
  // trajectories drift apart: measured worst gaps over 20 steps 0.02-1.6 % for ten kernels and
  // 4.5 % for slay. 10 % stays well below what a broken run shows: with stale weights the loss
  // stops falling (5.7 at step 10 against fp32's 3.7: 50 %).
  EXPECT_LT(worst, 0.10) << what;
  EXPECT_TRUE(differs) << what << ": bf16_autocast ran bit for bit as fp32: autocast did nothing";
  // Random-feature attention keeps its features, running sums and normaliser in fp32 under bf16.
  const auto dtypes = LastFusedCausalDtypes();
  if (dtypes.inputs != c10::ScalarType::Undefined) {  // kernels that ran the fused operator
    EXPECT_EQ(dtypes.inputs, torch::kFloat32) << what;
    EXPECT_EQ(dtypes.features, torch::kFloat32) << what;
    EXPECT_EQ(dtypes.state, torch::kFloat32) << what;
    EXPECT_EQ(dtypes.normaliser, torch::kFloat32) << what;
    EXPECT_EQ(dtypes.gradients, torch::kFloat32) << what;
  }
}

}  // namespace darkformer::testing
