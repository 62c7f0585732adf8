// The divergence rules and the rewind's pure rules against hand-worked cases: which step declares
// and which is the first bad one, the detector's state across a checkpoint, the checkpoint a
// rewind picks, loader positions moved across epochs, and the checkpoints a rewind may still need.
#include <gtest/gtest.h>

#include "train/divergence.h"
#include "train/rewind.h"

namespace darkformer {
namespace {

SpikeConfig::Divergence Rules(int64_t spikes, int64_t window, int64_t skips = 0) {
  SpikeConfig::Divergence rules;
  rules.spikes = spikes;
  rules.window = window;
  rules.consecutive_skips = skips;
  return rules;
}

TEST(DivergenceDetector, SpikesWithinTheWindowDeclareWithTheFirstOfThem) {
  DivergenceDetector d(Rules(3, 5));
  EXPECT_FALSE(d.Observe(10, true, false, true));
  EXPECT_FALSE(d.Observe(14, true, false, true));
  EXPECT_FALSE(d.Observe(16, true, false, true)) << "step 10 left the window (steps 12..16)";
  const auto found = d.Observe(17, true, false, true);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->declared_at, 17);
  EXPECT_EQ(found->first_bad, 14);
  EXPECT_FALSE(d.Observe(18, true, false, true)) << "a declared episode is forgotten";
}

TEST(DivergenceDetector, NonfiniteAndSkippedUpdatesInARow) {
  DivergenceDetector nonfinite(Rules(9, 10));
  EXPECT_FALSE(nonfinite.Observe(3, true, false, true));
  const auto found = nonfinite.Observe(5, false, true, false);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->first_bad, 3) << "the flagged step before it starts the episode";
  auto rules = Rules(9, 10, 3);
  rules.nonfinite = false;
  DivergenceDetector skips(rules);
  EXPECT_FALSE(skips.Observe(1, false, true, true));
  EXPECT_FALSE(skips.Observe(2, false, false, true));
  EXPECT_FALSE(skips.Observe(3, false, true, false));
  EXPECT_FALSE(skips.Observe(4, false, true, false));
  const auto third = skips.Observe(5, false, true, false);
  ASSERT_TRUE(third);
  EXPECT_EQ(third->first_bad, 3);
}

TEST(DivergenceDetector, StateSurvivesACheckpoint) {
  DivergenceDetector a(Rules(3, 10, 4)), b(Rules(3, 10, 4));
  a.Observe(1, true, true, true);
  a.Observe(2, true, true, true);
  b.Restore(a.Serialize());
  EXPECT_EQ(b.Serialize(), a.Serialize());
  EXPECT_EQ(a.Observe(3, true, false, true)->first_bad, 1);
  EXPECT_EQ(b.Observe(3, true, false, true)->first_bad, 1);
  EXPECT_THROW(b.Restore("1,x;0,0"), Error);
  b.Restore("");
  EXPECT_EQ(b.Serialize(), ";0,0");
}

TEST(Rewind, TargetIsBeforeTheUpdateThatPrecededTheFirstBadStep) {
  const CheckpointList checkpoints = {{5, "a"}, {10, "b"}, {15, "c"}};
  EXPECT_EQ(RewindTarget(checkpoints, 17, 0)->first, 15);
  EXPECT_EQ(RewindTarget(checkpoints, 16, 0)->first, 10) << "checkpoint 15 holds update 15, which step 16's loss saw";
  EXPECT_EQ(RewindTarget(checkpoints, 17, 3)->first, 10);
  EXPECT_FALSE(RewindTarget(checkpoints, 6, 0));
}

TEST(Rewind, PositionsMoveAcrossEpochs) {
  LoaderState s;
  s.batches_per_epoch = 7;
  s.epoch = 1;
  s.step = 5;
  EXPECT_EQ(MicroBatchesRead(s), 12);
  const auto moved = AdvancedBy(s, 10);
  EXPECT_EQ(moved.epoch, 3);
  EXPECT_EQ(moved.step, 1);
  EXPECT_EQ(MicroBatchesRead(moved), 22);
}

TEST(Rewind, CheckpointsARewindMayNeedAreKept) {
  TrainConfig train;
  train.keep_last = 1;
  const CheckpointList checkpoints = {{10, "a"}, {20, "b"}, {30, "c"}, {40, "d"}};
  EXPECT_EQ(CheckpointsToPrune(checkpoints, 40, train), (std::vector<std::string>{"a", "b", "c"}));
  train.spikes.on_divergence = DivergenceAction::kRewind;
  train.spikes.divergence.window = 15;
  // A divergence declared at step 41 or later has its first bad step at 27 or later: it rewinds to
  // checkpoint 20 at the earliest, so 10 alone can go.
  EXPECT_EQ(CheckpointsToPrune(checkpoints, 40, train), std::vector<std::string>{"a"});
  train.spikes.rewind.min_steps_back = 20;
  EXPECT_TRUE(CheckpointsToPrune(checkpoints, 40, train).empty());
}

}  // namespace
}  // namespace darkformer
