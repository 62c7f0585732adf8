// A tiny model on CPU learns the generated corpus (phrases repeated within each document) with
// exact, performer and darkformer attention: the mean training loss of the last 10 of 150 steps
// falls below kFinalLossThreshold, from about ln(vocab) = 5.8 at the start.
#include <gtest/gtest.h>

#include <cstdio>

#include "data/data_test_util.h"
#include "train/tiny_run.h"
#include "train/trainer.h"

namespace darkformer {
namespace {

constexpr int64_t kSteps = 120;
constexpr double kFinalLossThreshold = 1.0;  // nats per token

class ConvergenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConvergenceTest, LossFallsBelowThresholdWithin120Steps) {
  testing::TempDir dir;
  Trainer trainer(testing::TinyRunConfig(dir.path(), GetParam(),
                                         {"train.steps=" + std::to_string(kSteps)}));
  ASSERT_EQ(trainer.Run(), kExitOk);
  const auto lines = testing::TrainLines(dir.path());
  ASSERT_EQ(static_cast<int64_t>(lines.size()), kSteps);
  const double initial = lines.front()["loss"].as<double>();
  double final = 0.0;
  for (size_t i = lines.size() - 10; i < lines.size(); ++i) final += lines[i]["loss"].as<double>() / 10.0;
  std::printf("[ %s ] initial loss %.4f, mean loss of the last 10 of %lld steps %.4f (threshold %.2f)\n",
              GetParam().c_str(), initial, static_cast<long long>(kSteps), final, kFinalLossThreshold);
  EXPECT_GT(initial, 4.0);
  EXPECT_LT(final, kFinalLossThreshold);
}

INSTANTIATE_TEST_SUITE_P(Kernels, ConvergenceTest, ::testing::Values("exact", "performer", "darkformer"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace darkformer
