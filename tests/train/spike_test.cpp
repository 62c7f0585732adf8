// The spike and non-finite paths, driven by train.fault_injection: a learning-rate jump mid-run is
// logged to spikes.jsonl with its statistics and per-layer attention magnitudes; a NaN loss is
// skipped (on_nonfinite: skip) or stops the run writing the batch position (on_nonfinite: stop).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "data/data_test_util.h"
#include "train/tiny_run.h"
#include "train/trainer.h"

namespace darkformer {
namespace {

TEST(SpikeTest, LearningRateJumpIsLoggedWithItsFields) {
  testing::TempDir dir;
  // Layer 0 exact (reports the largest logit), layer 1 darkformer (also the largest log feature).
  const auto config = testing::TinyRunConfig(
      dir.path(), "darkformer",
      {"attention.per_layer={0: exact}", "train.steps=40", "train.schedule=constant", "train.lr=3.0e-3",
       "train.grad_clip=0", "train.spikes.window=10", "train.spikes.min_history=8",
       "train.fault_injection.lr_multiplier_at_step={step: 25, factor: 300}"});
  ASSERT_EQ(Trainer(config).Run(), kExitOk);
  const auto events = testing::ReadJsonl(dir.path() + "/spikes.jsonl");
  // The first event at or after the jump (ordinary training before it is not what this tests).
  auto jump = std::find_if(events.begin(), events.end(), [](const YAML::Node& e) { return e["step"].as<int64_t>() >= 25; });
  ASSERT_NE(jump, events.end()) << "no spike logged after the lr jump";
  const auto& e = *jump;
  const int64_t step = e["step"].as<int64_t>();
  std::printf("[ lr jump ] %zu spike events, %zu before the jump\n", events.size(),
              static_cast<size_t>(jump - events.begin()));
  // The jumped update lands at step 25; the loss it causes is seen by step 26's forward.
  EXPECT_GE(step, 25);
  EXPECT_LE(step, 27);
  for (const char* key : {"step", "loss", "window_mean", "window_std", "z", "lr", "grad_norm", "grad_norm_z",
                          "reason", "layers"}) {
    EXPECT_TRUE(e[key].IsDefined() && !e[key].IsNull()) << "spike event lacks " << key;
  }
  EXPECT_GT(e["loss"].as<double>(), e["window_mean"].as<double>());
  ASSERT_EQ(e["layers"].size(), 2u);
  EXPECT_EQ(e["layers"][0]["kernel"].as<std::string>(), "exact");
  EXPECT_EQ(e["layers"][1]["kernel"].as<std::string>(), "darkformer");
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(e["layers"][i]["layer"].as<int64_t>(), static_cast<int64_t>(i));
    EXPECT_GT(e["layers"][i]["max_logit"].as<double>(), 0.0);
  }
  EXPECT_TRUE(e["layers"][0]["max_log_feature"].IsNull());  // exact: no features
  EXPECT_TRUE(std::isfinite(e["layers"][1]["max_log_feature"].as<double>()));
  std::printf("[ lr jump x300 at step 25 ] spike at step %lld: loss %.4f, window mean %.4f std %.4f, z %.1f, "
              "grad norm %.3f, reason %s, max logit L0 %.3f L1 %.3f, max log feature L1 %.3f\n",
              static_cast<long long>(step), e["loss"].as<double>(), e["window_mean"].as<double>(),
              e["window_std"].as<double>(), e["z"].as<double>(), e["grad_norm"].as<double>(),
              e["reason"].as<std::string>().c_str(), e["layers"][0]["max_logit"].as<double>(),
              e["layers"][1]["max_logit"].as<double>(), e["layers"][1]["max_log_feature"].as<double>());
  // The metrics line of that step is flagged too.
  EXPECT_TRUE(testing::TrainLines(dir.path())[step - 1]["spike"].as<bool>());
}

TEST(NonfiniteTest, NanLossIsSkippedWhenConfiguredSkip) {
  testing::TempDir dir;
  const auto config = testing::TinyRunConfig(
      dir.path(), "exact", {"train.steps=10", "train.spikes.on_nonfinite=skip", "train.fault_injection.nan_loss_at_step=5"});
  Trainer trainer(config);
  ASSERT_EQ(trainer.Run(), kExitOk);
  const auto lines = testing::TrainLines(dir.path());
  ASSERT_EQ(lines.size(), 10u);
  EXPECT_TRUE(lines[4]["loss"].IsNull());  // NaN is logged as null
  EXPECT_TRUE(lines[4]["skipped"].as<bool>());
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i != 4) EXPECT_TRUE(std::isfinite(lines[i]["loss"].as<double>())) << "step " << i + 1;
  }
  EXPECT_EQ(trainer.state().skipped_updates, 1);
  for (const auto& item : trainer.model()->named_parameters()) {
    EXPECT_TRUE(torch::isfinite(item.value()).all().item<bool>()) << item.key() << " took the NaN update";
  }
  EXPECT_FALSE(std::filesystem::exists(dir.File("nonfinite.json")));
}

TEST(NonfiniteTest, NanLossStopsTheRunAndWritesTheBatchPosition) {
  testing::TempDir dir;
  const auto config = testing::TinyRunConfig(
      dir.path(), "exact", {"train.steps=10", "train.spikes.on_nonfinite=stop", "train.fault_injection.nan_loss_at_step=5"});
  ASSERT_EQ(Trainer(config).Run(), kExitDiverged);
  const auto where = YAML::LoadFile(dir.File("nonfinite.json"));
  EXPECT_EQ(where["step"].as<int64_t>(), 5);
  EXPECT_TRUE(where["loss"].IsNull());
  // Steps 1-4 took batches 0-3 of epoch 0: the offending batch is batch 4.
  EXPECT_EQ(where["loader_epoch"].as<int64_t>(), 0);
  EXPECT_EQ(where["loader_step"].as<int64_t>(), 4);
  PackedLoader loader(config.data, "train");
  EXPECT_EQ(where["rows"].as<std::vector<int64_t>>(), loader.RowsOfBatch(0, 4));
  EXPECT_EQ(testing::TrainLines(dir.path()).size(), 4u);  // the stopped step is not logged as done
  const auto summary = YAML::LoadFile(dir.File("summary.json"));
  EXPECT_TRUE(summary["diverged"].as<bool>());
}

}  // namespace
}  // namespace darkformer
