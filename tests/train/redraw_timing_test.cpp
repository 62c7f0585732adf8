// Redraw policies draw before the step that trains on the draw (attention_kernel.h,
// before_train_step): a run's checkpoint, and so its evaluation and generation, holds the draw its
// last steps trained with, never one drawn after them. Four steps: every_step draws before steps
// 2, 3 and 4 (3 draws, not 4); every_n with redraw_interval 2 before step 3 only (1, not 2), the
// draw that steps 3 and 4 trained.
#include <gtest/gtest.h>

#include "attention/feature_kernel_base.h"
#include "data/data_test_util.h"
#include "model/weights_io.h"
#include "train/tiny_run.h"
#include "train/trainer.h"

namespace darkformer {
namespace {

// Each layer's draw count in the run's latest checkpoint.
std::vector<int64_t> CheckpointDrawCounts(const RunConfig& config) {
  GemmaModel model(config.model, config.attention);
  const auto latest = LatestCheckpoint(config.log.dir);
  EXPECT_TRUE(latest.has_value());
  if (!latest) return {};
  LoadWeights(*latest, *model);
  std::vector<int64_t> counts;
  for (int64_t i = 0; i < config.model.num_hidden_layers; ++i) {
    const auto kernel = std::dynamic_pointer_cast<FeatureKernelBase>(model->attention_layer(i)->kernel().ptr());
    EXPECT_NE(kernel, nullptr);
    if (kernel) counts.push_back(kernel->draw_count());
  }
  return counts;
}

std::vector<int64_t> DrawCountsAfterFourSteps(const std::vector<std::string>& redraw) {
  testing::TempDir dir;
  auto overrides = redraw;
  overrides.push_back("train.steps=4");
  const auto config = testing::TinyRunConfig(dir.path(), "performer", overrides);
  EXPECT_EQ(Trainer(config).Run(), kExitOk);
  return CheckpointDrawCounts(config);
}

TEST(RedrawTimingTest, EveryStepDrawsBeforeEachStepButTheFirst) {
  EXPECT_EQ(DrawCountsAfterFourSteps({"attention.performer.redraw=every_step"}), (std::vector<int64_t>{3, 3}));
}

TEST(RedrawTimingTest, EveryNDrawsBeforeTheStepsTheDrawServes) {
  EXPECT_EQ(DrawCountsAfterFourSteps({"attention.performer.redraw=every_n", "attention.performer.redraw_interval=2"}),
            (std::vector<int64_t>{1, 1}));
  // An interval past the run: the initial draw throughout.
  EXPECT_EQ(DrawCountsAfterFourSteps({"attention.performer.redraw=every_n", "attention.performer.redraw_interval=4"}),
            (std::vector<int64_t>{0, 0}));
}

}  // namespace
}  // namespace darkformer
