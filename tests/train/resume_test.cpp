// Resuming is bit-exact on CPU with train.deterministic: 2N steps in one run equal N steps, an
// interruption (checkpoint, exit 130), a resume and N more: the same loss and grad norm at every
// step and bit-identical final weights.
#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "model/weights_io.h"
#include "train/tiny_run.h"
#include "train/trainer.h"

namespace darkformer {
namespace {

constexpr int64_t kN = 8;

std::map<std::string, torch::Tensor> FinalWeights(const RunConfig& config) {
  GemmaModel model(config.model, config.attention);
  const auto latest = LatestCheckpoint(config.log.dir);
  EXPECT_TRUE(latest.has_value());
  LoadWeights(*latest, *model);
  std::map<std::string, torch::Tensor> weights;
  for (const auto& item : model->named_parameters()) weights[item.key()] = item.value().clone();
  for (const auto& item : model->named_buffers()) weights[item.key()] = item.value().clone();
  return weights;
}

class ResumeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ResumeTest, TwoNStepsEqualNStepsResumeNSteps) {
  testing::TempDir straight_dir, resumed_dir;
  // redraw every step exercises the kernel draw state through the checkpoint too.
  const std::vector<std::string> common = {"train.steps=" + std::to_string(2 * kN), "train.checkpoint_every=3",
                                           "attention.performer.redraw=every_step"};
  const auto straight_config = testing::TinyRunConfig(straight_dir.path(), GetParam(), common);
  ASSERT_EQ(Trainer(straight_config).Run(), kExitOk);

  auto interrupted = common;
  interrupted.push_back("train.fault_injection.stop_at_step=" + std::to_string(kN));
  const auto resumed_config = testing::TinyRunConfig(resumed_dir.path(), GetParam(), interrupted);
  ASSERT_EQ(Trainer(resumed_config).Run(), kExitInterrupted);
  ASSERT_EQ(testing::TrainLines(resumed_dir.path()).size(), static_cast<size_t>(kN));
  ASSERT_EQ(Trainer(resumed_config).Run(), kExitOk);  // resumes from the step-N checkpoint

  const auto a = testing::TrainLines(straight_dir.path()), b = testing::TrainLines(resumed_dir.path());
  ASSERT_EQ(a.size(), static_cast<size_t>(2 * kN));
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["step"].as<int64_t>(), b[i]["step"].as<int64_t>());
    // Logged with 10 significant digits; the final weights below are compared bit for bit.
    EXPECT_EQ(a[i]["loss"].as<std::string>(), b[i]["loss"].as<std::string>()) << "step " << i + 1;
    EXPECT_EQ(a[i]["grad_norm"].as<std::string>(), b[i]["grad_norm"].as<std::string>()) << "step " << i + 1;
  }
  std::printf("[ %s ] loss at step %lld: %s (one run) vs %s (resumed at %lld)\n", GetParam().c_str(),
              static_cast<long long>(2 * kN), a.back()["loss"].as<std::string>().c_str(),
              b.back()["loss"].as<std::string>().c_str(), static_cast<long long>(kN));
  const auto wa = FinalWeights(straight_config), wb = FinalWeights(resumed_config);
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [name, tensor] : wa) {
    ASSERT_TRUE(wb.count(name)) << name;
    EXPECT_TRUE(torch::equal(tensor, wb.at(name))) << name << " differs after resume";
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ResumeTest, ::testing::Values("exact", "performer", "darkformer"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace darkformer
