// train.spikes.on_divergence, driven by train.fault_injection (an lr times 300 for two data
// batches, or a NaN loss): `continue` is today's run, `stop` stops at the step the rules declare,
// `rewind` reloads the checkpoint the rule picks, skips exactly the batches it should (checked
// against the positions rewinds.jsonl logs and against the steps themselves) and ends finite, and
// its losses afterwards equal, bit for bit, a plain resume from that checkpoint with those batches
// skipped. max_rewinds stops a run that keeps diverging; bad values are refused naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "data/data_test_util.h"
#include "train/child_process.h"
#include "train/rewind.h"
#include "train/tiny_run.h"
#include "train/trainer.h"

namespace darkformer {
namespace {

constexpr int64_t kSteps = 40, kEvery = 5, kSkip = 3;

std::vector<std::string> Diverging(const std::string& on_divergence, std::vector<std::string> more = {}) {
  std::vector<std::string> sets = {
      "train.steps=" + std::to_string(kSteps), "train.schedule=constant", "train.lr=3.0e-3", "train.grad_clip=0",
      "train.spikes.window=10", "train.spikes.min_history=8", "train.checkpoint_every=" + std::to_string(kEvery),
      "train.keep_last=1", "eval.every=0", "train.spikes.divergence={spikes: 2, window: 10}",
      "train.spikes.rewind={skip_batches: " + std::to_string(kSkip) + "}",
      "train.fault_injection.lr_multiplier_at_step={step: 25, factor: 300, steps: 2}",
      "train.spikes.on_divergence=" + on_divergence};
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

// The step at which the rules declare divergence, read from a `continue` run's metrics alone:
// the first with 2 flagged steps among the last 10, or a non-finite loss. And its first bad step.
std::pair<int64_t, int64_t> ExpectedDivergence(const std::vector<YAML::Node>& lines) {
  std::vector<int64_t> flagged;
  for (const auto& line : lines) {
    const int64_t step = line["step"].as<int64_t>();
    if (line["spike"].as<bool>()) flagged.push_back(step);
    std::vector<int64_t> recent;
    for (const auto s : flagged) {
      if (s > step - 10) recent.push_back(s);
    }
    if (recent.size() >= 2 || line["loss"].IsNull()) return {step, recent.empty() ? step : recent.front()};
  }
  return {0, 0};
}

std::vector<double> Losses(const std::vector<YAML::Node>& lines, int64_t after_step) {
  std::vector<double> losses;
  for (const auto& line : lines) {
    if (line["step"].as<int64_t>() > after_step) losses.push_back(line["loss"].as<double>());
  }
  return losses;
}

TEST(RewindTest, ContinueKeepsTodaysRunAndStopStopsAtTheDeclaredStep) {
  testing::TempDir plain, declared, stopped;
  // Today's run: no divergence keys at all.
  std::vector<std::string> today;
  for (const auto& set : Diverging("continue")) {
    if (set.rfind("train.spikes.divergence", 0) != 0 && set.rfind("train.spikes.rewind", 0) != 0 &&
        set.rfind("train.spikes.on_divergence", 0) != 0) {
      today.push_back(set);
    }
  }
  ASSERT_EQ(Trainer(testing::TinyRunConfig(plain.path(), "exact", today)).Run(), kExitOk);
  ASSERT_EQ(Trainer(testing::TinyRunConfig(declared.path(), "exact", Diverging("continue"))).Run(), kExitOk);
  const auto lines = testing::TrainLines(plain.path());
  EXPECT_EQ(Losses(testing::TrainLines(declared.path()), 0), Losses(lines, 0));
  const auto a = YAML::LoadFile(plain.File("summary.json")), b = YAML::LoadFile(declared.File("summary.json"));
  for (const char* key : {"steps", "final_loss", "spikes", "skipped_updates", "diverged", "rewinds"}) {
    EXPECT_EQ(a[key].as<std::string>(), b[key].as<std::string>()) << key;
  }
  EXPECT_FALSE(std::filesystem::exists(declared.File("rewinds.jsonl")));

  const auto [declared_at, first_bad] = ExpectedDivergence(lines);
  ASSERT_GE(declared_at, 25) << "the lr jump at batch 25 must set off the rules";
  Trainer stop(testing::TinyRunConfig(stopped.path(), "exact", Diverging("stop")));
  EXPECT_EQ(stop.Run(), kExitDiverged);
  EXPECT_EQ(stop.state().step, declared_at);
  const auto summary = YAML::LoadFile(stopped.File("summary.json"));
  EXPECT_TRUE(summary["diverged"].as<bool>());
  EXPECT_EQ(summary["steps"].as<int64_t>(), declared_at);
  std::printf("[ divergence ] lr x300 at batches 25-26: declared at step %lld, first bad step %lld\n",
              static_cast<long long>(declared_at), static_cast<long long>(first_bad));
}

TEST(RewindTest, RewindReloadsTheRightCheckpointSkipsTheBatchesAndMatchesAResumeWithThemSkipped) {
  testing::TempDir reference, rewound, resumed;
  ASSERT_EQ(Trainer(testing::TinyRunConfig(reference.path(), "exact", Diverging("continue"))).Run(), kExitOk);
  const auto [declared_at, first_bad] = ExpectedDivergence(testing::TrainLines(reference.path()));
  const int64_t target = (first_bad - 2) / kEvery * kEvery;  // the newest checkpoint before the damaging update

  Trainer trainer(testing::TinyRunConfig(rewound.path(), "exact", Diverging("rewind")));
  ASSERT_EQ(trainer.Run(), kExitOk);
  const auto rows = testing::ReadJsonl(rewound.File("rewinds.jsonl"));
  ASSERT_EQ(rows.size(), 1u);
  const auto& row = rows[0];
  EXPECT_EQ(row["rewind"].as<int64_t>(), 1);
  EXPECT_EQ(row["from_step"].as<int64_t>(), declared_at);
  EXPECT_EQ(row["first_bad_step"].as<int64_t>(), first_bad);
  EXPECT_EQ(row["to_step"].as<int64_t>(), target);
  // One micro-batch a step and no earlier skip: data positions are step numbers.
  EXPECT_EQ(row["data_at_checkpoint"]["micro_batches"].as<int64_t>(), target);
  EXPECT_EQ(row["data_read"]["micro_batches"].as<int64_t>(), declared_at);
  EXPECT_EQ(row["data_resumes_at"]["micro_batches"].as<int64_t>(), declared_at + kSkip);
  EXPECT_EQ(row["batches_skipped"].as<int64_t>(), declared_at + kSkip - target);
  EXPECT_GE(row["spikes"].size(), 1u);
  EXPECT_TRUE(row["spikes"][0]["layers"].IsSequence());
  EXPECT_EQ(trainer.state().step, kSteps);
  EXPECT_EQ(trainer.state().rewinds, 1);
  const auto lines = testing::TrainLines(rewound.path());
  ASSERT_EQ(static_cast<int64_t>(lines.size()), kSteps) << "one line a step: the abandoned steps' lines are gone";
  for (const auto& line : lines) EXPECT_TRUE(std::isfinite(line["loss"].as<double>())) << line["step"];
  const auto summary = YAML::LoadFile(rewound.File("summary.json"));
  EXPECT_EQ(summary["rewinds"].as<int64_t>(), 1);
  EXPECT_EQ(summary["batches_skipped"].as<int64_t>(), declared_at + kSkip - target);
  EXPECT_FALSE(summary["diverged"].as<bool>());

  // The same from a plain resume: run to the target, move the checkpoint's data position past the
  // skipped batches with the checkpoint functions alone, resume without any divergence handling.
  auto first = Diverging("continue", {"train.steps=" + std::to_string(target)});
  {
    Trainer head(testing::TinyRunConfig(resumed.path(), "exact", first));  // holds the run's lock until it goes
    ASSERT_EQ(head.Run(), kExitOk);
    auto state = head.state();
    state.loader = AdvancedBy(state.loader, declared_at + kSkip - target);
    YAML::Emitter attention;
    attention << testing::TinyRunConfig(resumed.path(), "exact", first).resolved["attention"];
    SaveCheckpoint(CheckpointPath(resumed.path(), target), *head.model(), head.optimizer(), state, attention.c_str());
  }
  ASSERT_EQ(Trainer(testing::TinyRunConfig(resumed.path(), "exact", Diverging("continue"))).Run(), kExitOk);
  const auto after = Losses(lines, target), plain = Losses(testing::TrainLines(resumed.path()), target);
  ASSERT_EQ(after.size(), static_cast<size_t>(kSteps - target));
  EXPECT_EQ(after, plain) << "the losses after the rewind differ from a resume with the batches skipped";
  std::printf("[ rewind ] declared at %lld (first bad %lld): back to step %lld, %lld batches skipped; "
              "final loss %.6f, equal to the plain resume's over %zu steps\n",
              static_cast<long long>(declared_at), static_cast<long long>(first_bad), static_cast<long long>(target),
              static_cast<long long>(declared_at + kSkip - target), after.back(), after.size());
}

TEST(RewindTest, MaxRewindsStopsARunThatKeepsDiverging) {
  testing::TempDir dir;
  // A NaN keyed to the step number comes back after every rewind.
  Trainer trainer(testing::TinyRunConfig(
      dir.path(), "exact", Diverging("rewind", {"train.fault_injection.lr_multiplier_at_step={step: 0}",
                                                "train.fault_injection.nan_loss_at_step=22",
                                                "train.spikes.rewind.max_rewinds=2"})));
  EXPECT_EQ(trainer.Run(), kExitDiverged);
  EXPECT_EQ(testing::ReadJsonl(dir.File("rewinds.jsonl")).size(), 2u);
  const auto summary = YAML::LoadFile(dir.File("summary.json"));
  EXPECT_EQ(summary["rewinds"].as<int64_t>(), 2);
  EXPECT_TRUE(summary["diverged"].as<bool>());
  EXPECT_EQ(summary["steps"].as<int64_t>(), 22);
}

// kill -9 during a rewind (after the abandoned checkpoints go, after its rewinds.jsonl row, after
// the logs are cut back) and right after it (the target rewritten), then the same command: the
// same losses, rewinds and summary as the run that was never killed.
TEST(RewindTest, Kill9DuringAndRightAfterARewindResumesToTheSameRun) {
  if (!std::filesystem::exists(Binary())) GTEST_SKIP() << "no darkformer binary at " << Binary();
  testing::TempDir dir;
  const auto run = [&](const std::string& name, const std::vector<std::string>& sets) {
    const std::string run_dir = dir.File(name), config = dir.File(name + ".yaml");
    testing::WriteYaml(config, testing::TinyRunYaml(run_dir, "exact", Diverging("rewind")));
    return Wait(StartTrain(config, dir.File(name + ".log"), sets));
  };
  ASSERT_EQ(run("whole", {}), kExitOk) << testing::ReadFile(dir.File("whole.log"));
  const auto want = Losses(testing::TrainLines(dir.File("whole")), 0);
  const auto want_summary = YAML::LoadFile(dir.File("whole/summary.json"));
  const auto want_rewinds = testing::ReadJsonl(dir.File("whole/rewinds.jsonl"));
  ASSERT_EQ(want_rewinds.size(), 1u);
  for (int phase = 1; phase <= 4; ++phase) {
    const std::string name = "killed" + std::to_string(phase);
    ASSERT_EQ(run(name, {"train.fault_injection.kill_in_rewind=" + std::to_string(phase)}), 128 + SIGKILL)
        << testing::ReadFile(dir.File(name + ".log"));
    ASSERT_EQ(run(name, {}), kExitOk) << testing::ReadFile(dir.File(name + ".log"));
    EXPECT_EQ(Losses(testing::TrainLines(dir.File(name)), 0), want) << "phase " << phase;
    const auto summary = YAML::LoadFile(dir.File(name + "/summary.json"));
    for (const char* key : {"steps", "final_loss", "min_loss", "spikes", "skipped_updates", "rewinds", "batches_skipped",
                            "diverged", "tokens_seen"}) {
      EXPECT_EQ(summary[key].as<std::string>(), want_summary[key].as<std::string>()) << key << ", phase " << phase;
    }
    const auto rewinds = testing::ReadJsonl(dir.File(name + "/rewinds.jsonl"));
    ASSERT_EQ(rewinds.size(), 1u) << "phase " << phase;
    for (const char* key : {"from_step", "to_step", "batches_skipped", "first_bad_step"}) {
      EXPECT_EQ(rewinds[0][key].as<int64_t>(), want_rewinds[0][key].as<int64_t>()) << key << ", phase " << phase;
    }
    std::printf("[ kill -9 in rewind, phase %d ] resumed: %zu steps, final loss %s, rewinds %s, as the whole run\n", phase,
                want.size(), summary["final_loss"].as<std::string>().c_str(), summary["rewinds"].as<std::string>().c_str());
  }
}

TEST(RewindTest, BadValuesAreRefusedNamingTheKey) {
  testing::TempDir dir;
  const auto error = [&](const std::vector<std::string>& sets) {
    try {
      testing::TinyRunConfig(dir.path(), "exact", sets);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error({"train.spikes.rewind.skip_batches=-1"}).find("'train.spikes.rewind.skip_batches' must be >= 0"),
            std::string::npos);
  const auto no_checkpoints = error({"train.spikes.on_divergence=rewind", "train.checkpoint_every=0"});
  EXPECT_NE(no_checkpoints.find("'train.spikes.on_divergence'"), std::string::npos) << no_checkpoints;
  EXPECT_NE(no_checkpoints.find("'train.checkpoint_every'"), std::string::npos) << no_checkpoints;
  EXPECT_NE(error({"train.spikes.on_divergence=rewound"}).find("did you mean 'rewind'?"), std::string::npos);
  EXPECT_NE(error({"train.spikes.rewind.max_rewinds=0"}).find("'train.spikes.rewind.max_rewinds' must be >= 1"),
            std::string::npos);
  EXPECT_NE(error({"train.spikes.rewind.lr_factor=0"}).find("'train.spikes.rewind.lr_factor' must be positive"),
            std::string::npos);
}

}  // namespace
}  // namespace darkformer
