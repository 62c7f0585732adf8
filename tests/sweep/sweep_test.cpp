// Sweeps: sweep-file parsing, grid expansion and naming, run status and summary tables.
#include "sweep/sweep_spec.h"
#include "sweep/sweep_state.h"
#include "sweep/sweep_status.h"
#include "sweep/sweep_summary.h"

#include <gtest/gtest.h>

#include "sweep/sweep_runner.h"
#include "sweep_test_util.h"
#include "util/error.h"

namespace darkformer {
namespace {

using namespace sweep_test;

TEST(SweepSpec, ParsesGridFixedAndResolvesBase) {
  TempDir dir;
  const auto spec = SpecIn(dir, "grid:\n  attention.kernel: [performer, darkformer]\n  train: {lr: [1.0e-4, 1.0e-3, 0.01]}\n"
                                "fixed: {train.steps: 5, eval: {every: 0}}\nparallel: 2\n");
  EXPECT_EQ(spec.base, dir.File("base.yaml"));
  ASSERT_EQ(spec.grid.size(), 2u);
  EXPECT_EQ(spec.grid[0].key, "attention.kernel");
  EXPECT_EQ(spec.grid[1].key, "train.lr");
  EXPECT_EQ(spec.grid[1].values.size(), 3u);
  EXPECT_EQ(spec.fixed, (std::vector<std::string>{"train.steps=5", "eval.every=0"}));
  EXPECT_EQ(spec.parallel, 2);
}

TEST(SweepSpec, UnknownKeyIsAnErrorNamingIt) {
  TempDir dir;
  try {
    SpecIn(dir, "grid: {train.lr: [0.1]}\nparalel: 2\n");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("paralel"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sweep.yaml"), std::string::npos) << e.what();
  }
}

TEST(SweepSpec, OverridesApplyToTheSweepFile) {
  TempDir dir;
  Write(dir.File("base.yaml"), kBaseConfig);
  Write(dir.File("sweep.yaml"), "base: base.yaml\noutput: a\ngrid: {train.lr: [0.1]}\n");
  const auto spec = SweepSpec::Load(dir.File("sweep.yaml"), {"output=b", "fixed.train.steps=7"});
  EXPECT_EQ(spec.output, "b");
  EXPECT_EQ(spec.fixed, (std::vector<std::string>{"train.steps=7"}));
}

TEST(ExpandGrid, CartesianProductLastAxisFastest) {
  std::vector<SweepAxis> grid = {{"attention.kernel", {YAML::Node("performer"), YAML::Node("darkformer")}},
                                 {"train.seed", {YAML::Node(0), YAML::Node(1), YAML::Node(2)}}};
  const auto points = ExpandGrid(grid);
  ASSERT_EQ(points.size(), 6u);
  EXPECT_EQ(points[0].name, "performer_seed0");
  EXPECT_EQ(points[2].name, "performer_seed2");
  EXPECT_EQ(points[3].name, "darkformer_seed0");
  EXPECT_EQ(points[5].values[1].second.as<int>(), 2);
}

TEST(ExpandGrid, EmptyGridIsOneRun) {
  const auto points = ExpandGrid({});
  ASSERT_EQ(points.size(), 1u);
  EXPECT_EQ(points[0].name, "run");
}

// The long names of sweeps before short ones (kept to migrate their output): characters outside
// [A-Za-z0-9.+-] (so also "_", the separator between axes) become "-".
TEST(RunName, LegacyNamesUseTheFullPathForSharedLastComponents) {
  const auto name = LegacyRunName({{"attention.performer.num_features", YAML::Node(64)},
                                   {"attention.darkformer.num_features", YAML::Node(32)},
                                   {"train.trainable", YAML::Load("['*q_proj*', '*k_proj*']")}});
  EXPECT_EQ(name.rfind("attention.performer.num-features-64_attention.darkformer.num-features-32_trainable-", 0), 0u)
      << name;
  EXPECT_EQ(name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.+-_"),
            std::string::npos)
      << name;
  EXPECT_EQ(LegacyRunName({{"train.lr", YAML::Load("1.0e-4")}}), "lr-1.0e-4");
}

// The issue's example: mqar_lr_sweep.yaml's point reads performer-m64_lr1e-4_seed0.
TEST(RunName, ShortNamesReadLikeThePapersTables) {
  const GridValues point = {{"attention", YAML::Load("{kernel: performer, performer: {num_features: 64}}")},
                            {"train.lr", YAML::Load("1.0e-4")},
                            {"train.seed", YAML::Node(0)}};
  EXPECT_EQ(RunName(point), "performer-m64_lr1e-4_seed0");
  EXPECT_EQ(LegacyRunName(point), "attention--kernel--performer--performer---num-features--64--_lr-1.0e-4_seed-0");
  EXPECT_EQ(RunName({{"train.lr", YAML::Load("3.0e-3")}, {"train.warmup_steps", YAML::Node(10)}}), "lr3e-3_warmup-steps10");
  // Words are set apart from their key, and a word with an 'e' stays whole.
  EXPECT_EQ(RunName({{"attention", YAML::Load("{kernel: darkformer, darkformer: {num_features: 64, init: whitening}}")},
                     {"data.document_masking", YAML::Load("false")}}),
            "darkformer-m64-init-whitening_document-masking-false");
  EXPECT_EQ(RunName({{"train.trainable", YAML::Load("['*q_proj*']")}}).find_first_not_of(
                "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.+-_"),
            std::string::npos);
}

TEST(ExpandGrid, AGridEntryNamesItselfAndTheNameIsNotAConfigKey) {
  const auto points = ExpandGrid({{"attention", {YAML::Load("{name: dark-white, kernel: darkformer, darkformer: {init: whitening}}"),
                                                 YAML::Load("{kernel: exact}")}},
                                  {"train.seed", {YAML::Node(1)}}});
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].name, "dark-white_seed1");
  EXPECT_EQ(points[1].name, "exact_seed1");
  EXPECT_FALSE(points[0].values[0].second["name"]) << "name: is stripped from what the run gets";
  EXPECT_EQ(points[0].values[0].second["kernel"].as<std::string>(), "darkformer");
}

TEST(ExpandGrid, ShortNamesThatWouldClashFallBackToTheLongOnes) {
  // Two keys whose short forms read alike: 1 and 1.0 both print "1".
  const auto points = ExpandGrid({{"train.lr", {YAML::Load("1"), YAML::Load("1.0")}}});
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].name, "lr-1");
  EXPECT_EQ(points[1].name, "lr-1.0");
}

TEST(ExpandGrid, RepeatedValuesAreAnError) {
  EXPECT_THROW(ExpandGrid({{"train.lr", {YAML::Node(0.1), YAML::Node(0.1)}}}), Error);
}

TEST(RunOverrides, FixedThenGridThenLogDir) {
  SweepSpec spec;
  spec.output = "runs/x";
  spec.fixed = {"train.steps=5"};
  const auto points = ExpandGrid({{"train.trainable", {YAML::Load("['*q_proj*', '*.kernel.*']")}}});
  const auto overrides = RunOverrides(spec, points[0]);
  ASSERT_EQ(overrides.size(), 3u);
  EXPECT_EQ(overrides[0], "train.steps=5");
  EXPECT_EQ(YAML::Load(overrides[1].substr(overrides[1].find('=') + 1))[1].as<std::string>(), "*.kernel.*");
  EXPECT_EQ(overrides[2], "log.dir=runs/x/" + points[0].name);
}

TEST(RunCommand, PlainOrUnderTorchrun) {
  TempDir dir;
  auto spec = SpecIn(dir, "grid: {train.lr: [0.1]}\n");
  const auto point = ExpandGrid(spec.grid)[0];
  auto argv = RunCommand(spec, point, "/bin/darkformer");
  EXPECT_EQ((std::vector<std::string>(argv.begin(), argv.begin() + 4)),
            (std::vector<std::string>{"/bin/darkformer", "train", "--config", spec.base}));
  spec = SpecIn(dir, "grid: {train.lr: [0.1]}\nlauncher: {torchrun: /venv/bin/torchrun, nproc_per_node: 2}\n");
  argv = RunCommand(spec, point, "/bin/darkformer");
  EXPECT_EQ((std::vector<std::string>(argv.begin(), argv.begin() + 7)),
            (std::vector<std::string>{"/venv/bin/torchrun", "--standalone", "--nproc-per-node", "2", "--no-python",
                                      "/bin/darkformer", "train"}));
  // Explicit rendezvous flags replace --standalone.
  spec = SpecIn(dir, "grid: {train.lr: [0.1]}\nlauncher: {nproc_per_node: 4, args: [--nnodes, '2', "
                     "--rdzv-endpoint, 'host:29400']}\n");
  argv = RunCommand(spec, point, "/bin/darkformer");
  EXPECT_EQ((std::vector<std::string>(argv.begin(), argv.begin() + 8)),
            (std::vector<std::string>{"torchrun", "--nnodes", "2", "--rdzv-endpoint", "host:29400",
                                      "--nproc-per-node", "4", "--no-python"}));
  try {
    SpecIn(dir, "grid: {train.lr: [0.1]}\nlauncher: {nproc_per_node: 0}\n");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'launcher.nproc_per_node'"), std::string::npos) << e.what();
  }
}

TEST(ClassifyRun, FromSummaryCheckpointsAndExitCode) {
  TempDir dir;
  const auto run = dir.File("run");
  EXPECT_EQ(ClassifyRun(run, std::nullopt, 10, -1), RunStatus::kPending);
  Write(run + "/metrics.jsonl", "{}\n");
  EXPECT_EQ(ClassifyRun(run, std::nullopt, 10, -1), RunStatus::kPartial);
  EXPECT_EQ(ClassifyRun(run, std::nullopt, 10, 130), RunStatus::kPartial);
  EXPECT_EQ(ClassifyRun(run, std::nullopt, 10, 2), RunStatus::kFailed);
  Write(run + "/summary.json", R"({"steps":4,"final_loss":null,"diverged":false,"kernel":"exact"})");
  auto summary = ReadRunSummary(run);
  ASSERT_TRUE(summary);
  EXPECT_EQ(summary->steps, 4);
  EXPECT_EQ(summary->final_loss, 0.0);  // JSON null (non-finite) reads as 0
  EXPECT_EQ(ClassifyRun(run, summary, 10, 130), RunStatus::kPartial);
  EXPECT_EQ(ClassifyRun(run, summary, 4, 0), RunStatus::kFinished);
  summary->diverged = true;
  EXPECT_EQ(ClassifyRun(run, summary, 10, 3), RunStatus::kDiverged);
  EXPECT_FALSE(NeedsRun(RunStatus::kDiverged));
  EXPECT_FALSE(NeedsRun(RunStatus::kFinished));
  EXPECT_TRUE(NeedsRun(RunStatus::kFailed));
  EXPECT_TRUE(NeedsRun(RunStatus::kPartial));
}

TEST(SweepState, RoundTrips) {
  TempDir dir;
  SweepState state;
  state.runs["kernel-exact"] = {"finished", 0, 1};
  state.runs["kernel-performer"] = {"failed", 2, 3};
  state.Save(dir.File("out/sweep_state.yaml"));
  const auto loaded = SweepState::Load(dir.File("out/sweep_state.yaml"));
  ASSERT_EQ(loaded.runs.size(), 2u);
  EXPECT_EQ(loaded.runs.at("kernel-performer").status, "failed");
  EXPECT_EQ(loaded.runs.at("kernel-performer").exit_code, 2);
  EXPECT_EQ(loaded.runs.at("kernel-performer").attempts, 3);
  EXPECT_TRUE(SweepState::Load(dir.File("absent.yaml")).runs.empty());
}

TEST(SweepSummary, CsvAndMarkdownHaveGridValuesAndResults) {
  TempDir dir;
  const auto points = ExpandGrid({{"attention.kernel", {YAML::Node("performer"), YAML::Node("darkformer")}}});
  std::vector<SweepRecord> records(2);
  records[0].point = points[0];
  records[0].status = RunStatus::kFinished;
  records[0].exit_code = 0;
  records[0].summary = RunSummary{10, 1280, 2.5, 2.25, 0.3125, 1, 0, false, 12.34};
  records[1].point = points[1];
  WriteSummaryCsv(records, {"attention.kernel"}, dir.File("s.csv"));
  WriteSummaryMarkdown(records, {"attention.kernel"}, dir.File("s.md"), "title");
  const auto csv = Read(dir.File("s.csv"));
  EXPECT_EQ(csv,
            "run,attention.kernel,status,exit_code,steps,tokens_seen,final_loss,min_loss,best_eval_accuracy,spikes,"
            "skipped_updates,diverged,rewinds,batches_skipped,wall_seconds,mean_tokens_per_s,mean_mfu,peak_memory_bytes,"
            "kernel\n"
            "performer,performer,finished,0,10,1280,2.5000,2.2500,0.3125,1,0,false,0,0,12.3,0.0,0.0000,0,\n"
            "darkformer,darkformer,pending,-1,,,,,,,,,,,,,,,\n");
  const auto md = Read(dir.File("s.md"));
  EXPECT_NE(md.find("| performer | finished | 0 | 10 | 1280 | 2.5000 | 2.2500 | 0.3125 | 1 | 0 | false | 0 | 0 | 12.3 | 0.0 | 0.0000 | 0 |  |"),
            std::string::npos)
      << md;
}

}  // namespace
}  // namespace darkformer
