// The sweep runner's skip/resume/failure handling, renaming of old output and device pinning, with
// a stand-in program (a shell script) instead of a real training run.
#include "sweep/sweep_runner.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <set>

#include "sweep/sweep_state.h"
#include "sweep/sweep_status.h"
#include "sweep_test_util.h"
#include "util/error.h"

namespace darkformer {
namespace {

using namespace sweep_test;

// A stand-in for `darkformer train`: reads log.dir from the --set arguments and acts by run name:
// lr0.5 fails (exit 5), lr0.9 diverges (exit 3), lr0.3 is interrupted on its first attempt
// (exit 130 after 1 step), the rest finish 3 steps. Every launch appends to <dir>/launches.
const char* kFakeTrain = R"(#!/bin/sh
for a in "$@"; do case "$a" in log.dir=*) dir="${a#log.dir=}";; esac; done
mkdir -p "$dir"; echo x >> "$dir/launches"
case "$dir" in
  *lr0.5) exit 5;;
  *lr0.9) echo '{"steps":2,"diverged":true}' > "$dir/summary.json"; exit 3;;
  *lr0.3) if [ ! -f "$dir/once" ]; then touch "$dir/once"; echo '{"steps":1,"diverged":false}' > "$dir/summary.json"; exit 130; fi;;
esac
echo '{"steps":3,"final_loss":2.0,"min_loss":1.5,"best_eval_accuracy":0.25,"spikes":0,"diverged":false}' > "$dir/summary.json"
)";

int Launches(const std::string& run_dir) {
  std::ifstream in(run_dir + "/launches");
  int n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

TEST(RunSweep, SkipsFinishedResumesPartialRetriesFailedKeepsDiverged) {
  TempDir dir;
  Write(dir.File("fake_train.sh"), kFakeTrain);
  chmod(dir.File("fake_train.sh").c_str(), 0755);
  const auto spec = SpecIn(dir, "grid: {train.lr: [0.1, 0.3, 0.5, 0.9]}\nparallel: 2\n");
  SweepOptions options;
  options.program = dir.File("fake_train.sh");

  EXPECT_EQ(RunSweep(spec, options), 1);  // lr0.5 failed; the sweep went on
  auto records = InspectSweep(spec);
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0].status, RunStatus::kFinished);
  EXPECT_EQ(records[1].status, RunStatus::kPartial);
  EXPECT_EQ(records[2].status, RunStatus::kFailed);
  EXPECT_EQ(records[2].exit_code, 5);
  EXPECT_EQ(records[3].status, RunStatus::kDiverged);
  EXPECT_TRUE(fs::exists(dir.File("out/summary.csv")));
  EXPECT_TRUE(fs::exists(dir.File("out/summary.md")));
  EXPECT_NE(Read(dir.File("out/sweep_state.yaml")).find("exit_code: 5"), std::string::npos);

  EXPECT_EQ(RunSweep(spec, options), 1);  // second pass: only the partial and the failed run launch
  EXPECT_EQ(Launches(records[0].dir), 1);
  EXPECT_EQ(Launches(records[1].dir), 2);
  EXPECT_EQ(Launches(records[2].dir), 2);
  EXPECT_EQ(Launches(records[3].dir), 1);
  records = InspectSweep(spec);
  EXPECT_EQ(records[1].status, RunStatus::kFinished);
  const auto csv = Read(dir.File("out/summary.csv"));
  EXPECT_NE(csv.find("lr0.1,0.1,finished,0,3,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("lr0.9,0.9,diverged,3,2,"), std::string::npos) << csv;
}

// Output of a sweep from before short names: its long-named run directories and their
// sweep_state.yaml entries are renamed when the sweep next looks, and the runs go on from there;
// a directory whose trainer still runs is refused, naming it.
TEST(RunSweep, LongNamedOutputIsRenamedAndResumes) {
  TempDir dir;
  Write(dir.File("fake_train.sh"), kFakeTrain);
  chmod(dir.File("fake_train.sh").c_str(), 0755);
  const auto spec = SpecIn(dir, "grid: {train.lr: [0.1, 0.3]}\n");
  fs::create_directories(dir.File("out/lr-0.1"));
  Write(dir.File("out/lr-0.1/summary.json"), "{\"steps\":3,\"diverged\":false}\n");
  SweepState old;
  old.runs["lr-0.1"] = {"finished", 0, 1};
  old.Save(dir.File("out/sweep_state.yaml"));
  const auto records = InspectSweep(spec);
  EXPECT_FALSE(fs::exists(dir.File("out/lr-0.1")));
  EXPECT_EQ(records[0].dir, dir.File("out/lr0.1"));
  EXPECT_EQ(records[0].status, RunStatus::kFinished) << "its summary moved with it";
  EXPECT_EQ(SweepState::Load(dir.File("out/sweep_state.yaml")).runs.count("lr0.1"), 1u);
  SweepOptions options;
  options.program = dir.File("fake_train.sh");
  EXPECT_EQ(RunSweep(spec, options), 0);
  EXPECT_EQ(Launches(records[0].dir), 0) << "the finished run is not run again";
  EXPECT_EQ(Launches(dir.File("out/lr0.3")), 1);

  fs::create_directories(dir.File("out2/lr-0.1"));
  const int lock = open(dir.File("out2/lr-0.1/.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_EQ(flock(lock, LOCK_EX | LOCK_NB), 0);
  try {
    SpecIn(dir, "grid: {train.lr: [0.1]}\n");
    InspectSweep(SweepSpec::Load(dir.File("sweep.yaml"), {"output=" + dir.File("out2")}));
    ADD_FAILURE() << "a running trainer's directory was renamed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("still running"), std::string::npos) << e.what();
  }
  close(lock);
  EXPECT_TRUE(fs::exists(dir.File("out2/lr-0.1")));
}

// devices: [0, 1] with parallel 2: each child starts with its own CUDA_VISIBLE_DEVICES (a stand-in
// records it; no GPU needed); torchrun runs of 2 ranks get disjoint pairs; `auto` finds none here.
const char* kRecordDevices = R"(#!/bin/sh
for a in "$@"; do case "$a" in log.dir=*) dir="${a#log.dir=}";; esac; done
mkdir -p "$dir"; echo "${CUDA_VISIBLE_DEVICES:-unset}" > "$dir/devices"; sleep 0.3
echo '{"steps":3,"diverged":false}' > "$dir/summary.json"
)";

TEST(RunSweep, EachRunGetsItsOwnDevices) {
  TempDir dir;
  Write(dir.File("record.sh"), kRecordDevices);
  chmod(dir.File("record.sh").c_str(), 0755);
  SweepOptions options;
  options.program = dir.File("record.sh");
  auto spec = SpecIn(dir, "grid: {train.lr: [0.1, 0.3]}\nparallel: 2\ndevices: [0, 1]\n");
  EXPECT_EQ(RunSweep(spec, options), 0);
  std::multiset<std::string> seen;
  for (const auto& r : InspectSweep(spec)) seen.insert(Read(r.dir + "/devices"));
  EXPECT_EQ(seen, (std::multiset<std::string>{"0\n", "1\n"}));

  // Two ranks per run (the stand-in takes torchrun's place): disjoint pairs.
  spec = SpecIn(dir, "grid: {train.lr: [0.1, 0.3]}\nparallel: 2\ndevices: [0, 1, 2, 3]\n"
                     "launcher: {torchrun: " + dir.File("record_torchrun.sh") + ", nproc_per_node: 2}\n");
  spec.output = dir.File("out2");
  Write(dir.File("record_torchrun.sh"), kRecordDevices);
  chmod(dir.File("record_torchrun.sh").c_str(), 0755);
  EXPECT_EQ(RunSweep(spec, options), 0);
  seen.clear();
  for (const auto& r : InspectSweep(spec)) seen.insert(Read(r.dir + "/devices"));
  EXPECT_EQ(seen, (std::multiset<std::string>{"0,1\n", "2,3\n"}));

  // No CUDA here: `auto` pins nothing (a CPU machine runs as before).
  spec = SpecIn(dir, "grid: {train.lr: [0.1]}\ndevices: auto\n");
  spec.output = dir.File("out3");
  EXPECT_EQ(RunSweep(spec, options), 0);
  EXPECT_EQ(Read(InspectSweep(spec)[0].dir + "/devices"), "unset\n");
  for (const std::string bad : {"devices: [0, 0]", "devices: [x]", "devices: []"}) {
    try {
      SpecIn(dir, "grid: {train.lr: [0.1]}\n" + bad + "\n");
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("devices"), std::string::npos) << e.what();
    }
  }
}

TEST(RunSweep, InvalidRunConfigFailsBeforeLaunchingAnything) {
  TempDir dir;
  const auto spec = SpecIn(dir, "grid: {train.no_such_key: [1]}\n");
  SweepOptions options;
  options.program = "/bin/false";
  try {
    RunSweep(spec, options);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.no_such_key"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.File("out")));
}

}  // namespace
}  // namespace darkformer
