// Interruption, run against the darkformer binary as a child process: SIGINT/SIGTERM finish the
// step, write a checkpoint and exit 130 with a message, and a rerun resumes to the final step; a
// kill -9 during a checkpoint write leaves the previous checkpoint intact and loadable.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "data/data_test_util.h"
#include "model/weights_io.h"
#include "train/child_process.h"
#include "train/tiny_run.h"
#include "train/trainer.h"

namespace darkformer {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

bool HasTmpCheckpoint(const std::string& run_dir) {
  const auto dir = fs::path(run_dir) / "checkpoints";
  if (!fs::exists(dir)) return false;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".tmp") return true;
  }
  return false;
}

int64_t CheckpointStep(const std::string& path) {
  return YAML::Load(ReadStringAttributeH5(path, "trainer_state"))["step"].as<int64_t>();
}

class InterruptTest : public ::testing::TestWithParam<int> {};

TEST_P(InterruptTest, SignalFinishesTheStepCheckpointsAndExitsNonZero) {
  if (!fs::exists(Binary())) GTEST_SKIP() << "no darkformer binary at " << Binary();
  const int signal_number = GetParam();
  constexpr int64_t kSteps = 400;
  testing::TempDir dir;
  const std::string run_dir = dir.File("run"), config = dir.File("run.yaml"), log = dir.File("train.log");
  testing::WriteYaml(config, testing::TinyRunYaml(run_dir, "exact",
                                                  {"train.steps=" + std::to_string(kSteps), "log.every=1"}));
  const pid_t pid = StartTrain(config, log);
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (testing::TrainLines(run_dir).empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_FALSE(testing::TrainLines(run_dir).empty()) << testing::ReadFile(log);
  kill(pid, signal_number);
  const int code = Wait(pid);
  EXPECT_EQ(code, kExitInterrupted) << testing::ReadFile(log);
  const auto latest = LatestCheckpoint(run_dir);
  ASSERT_TRUE(latest.has_value()) << "no checkpoint after the signal";
  const int64_t stopped_at = CheckpointStep(*latest);
  EXPECT_GE(stopped_at, 1);
  EXPECT_LT(stopped_at, kSteps);
  EXPECT_NE(testing::ReadFile(log).find("stop requested"), std::string::npos) << testing::ReadFile(log);
  std::printf("[ signal %d ] exit code %d, checkpoint at step %lld of %lld\n", signal_number, code,
              static_cast<long long>(stopped_at), static_cast<long long>(kSteps));

  // The same command resumes and completes; each step is logged once.
  EXPECT_EQ(Wait(StartTrain(config, log)), kExitOk) << testing::ReadFile(log);
  EXPECT_NE(testing::ReadFile(log).find("resumed from"), std::string::npos);
  EXPECT_EQ(CheckpointStep(*LatestCheckpoint(run_dir)), kSteps);
  const auto lines = testing::TrainLines(run_dir);
  ASSERT_EQ(static_cast<int64_t>(lines.size()), kSteps);
  for (int64_t i = 0; i < kSteps; ++i) ASSERT_EQ(lines[i]["step"].as<int64_t>(), i + 1);
}

INSTANTIATE_TEST_SUITE_P(Signals, InterruptTest, ::testing::Values(SIGINT, SIGTERM),
                         [](const auto& info) { return info.param == SIGINT ? "SIGINT" : "SIGTERM"; });

TEST(KillTest, Kill9DuringCheckpointWriteLeavesThePreviousCheckpointIntact) {
  if (!fs::exists(Binary())) GTEST_SKIP() << "no darkformer binary at " << Binary();
  testing::TempDir dir;
  const std::string run_dir = dir.File("run"), config = dir.File("run.yaml"), log = dir.File("train.log");
  // A wider MLP makes each checkpoint (weights and Adam moments, ~40 MB) take a while to write.
  const auto yaml = testing::TinyRunYaml(run_dir, "exact",
                                         {"train.steps=1000", "train.checkpoint_every=1", "train.keep_last=2",
                                          "model.hidden_size=256", "model.intermediate_size=2048",
                                          "model.head_dim=64", "train.deterministic=false"});
  testing::WriteYaml(config, yaml);
  const auto run_config = RunConfig::FromNode(yaml, config);
  constexpr int kRounds = 3;
  int hits = 0;
  for (int round = 0; round < kRounds; ++round) {
    const pid_t pid = StartTrain(config, log);
    // Kill as soon as a checkpoint is being written while an earlier complete one exists.
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    while (Clock::now() < deadline && !(LatestCheckpoint(run_dir) && HasTmpCheckpoint(run_dir))) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    kill(pid, SIGKILL);
    ASSERT_EQ(Wait(pid), 128 + SIGKILL) << testing::ReadFile(log);
    const bool hit = HasTmpCheckpoint(run_dir);  // the write was cut off
    hits += hit;
    const auto latest = LatestCheckpoint(run_dir);
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(fs::path(*latest).extension(), ".h5");
    GemmaModel model(run_config.model, run_config.attention);
    EXPECT_NO_THROW(LoadWeights(*latest, *model)) << *latest;
    std::printf("[ kill -9 round %d ] write cut off: %s; latest complete checkpoint %s (step %lld) loads\n", round,
                hit ? "yes" : "no", fs::path(*latest).filename().c_str(),
                static_cast<long long>(CheckpointStep(*latest)));
  }
  EXPECT_GE(hits, 1) << "no kill landed inside a checkpoint write";
  // A rerun resumes from the intact checkpoint and clears the torn temporary file.
  const int64_t resume_step = CheckpointStep(*LatestCheckpoint(run_dir));
  EXPECT_EQ(Wait(StartTrain(config, log, {"train.steps=" + std::to_string(resume_step + 2)})), kExitOk)
      << testing::ReadFile(log);
  EXPECT_FALSE(HasTmpCheckpoint(run_dir));
  EXPECT_EQ(CheckpointStep(*LatestCheckpoint(run_dir)), resume_step + 2);
}

}  // namespace
}  // namespace darkformer
