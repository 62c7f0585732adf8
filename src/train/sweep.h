// Sweeps: a grid over run-config keys applied to a base run config. This file holds the pieces
// that need no processes: the sweep file, grid expansion, run naming, run status from a run
// directory, and the summary tables (CSV and Markdown). sweep_runner.h launches the runs.
//
//   base: ../micro/finetune_base.yaml   # run config the grid applies to (relative to this file)
//   output: runs/micro/lr_sweep          # run directories: <output>/<name> (relative to the cwd)
//   grid:                                # key path -> list of values; the last key varies fastest
//     attention.kernel: [performer, darkformer]
//     train.lr: [1.0e-4, 1.0e-3]
//   fixed: {train.steps: 100}            # optional overrides applied to every run
//   parallel: 1                          # runs at a time (child processes)
//   devices: [0, 1]                      # optional: CUDA devices, one per run (nproc_per_node per
//                                        #   torchrun run), CUDA_VISIBLE_DEVICES set round-robin;
//                                        #   `auto`: every visible one (none on a CPU machine)
//   launcher:                            # optional: each run as a torchrun job of data-parallel ranks
//     torchrun: .venv/bin/torchrun       #   the launcher (a path, or a name on PATH)
//     nproc_per_node: 2                  #   ranks per run
//     args: []                           #   more torchrun flags (--nnodes, --rdzv-endpoint ...);
//                                        #   none: --standalone (a free local port per run)
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "train/run_summary.h"
#include "train/sweep_names.h"

namespace darkformer {

struct SweepAxis {
  std::string key;                // dotted run-config key path, e.g. "train.lr"
  std::vector<YAML::Node> values; // scalars, lists or maps, passed on as YAML
};

// Runs each grid point under torchrun instead of as one process.
struct SweepLauncher {
  std::string torchrun = "torchrun";
  int64_t nproc_per_node = 0;     // 0: no launcher, one process per run
  std::vector<std::string> args;  // extra torchrun flags
};

struct SweepSpec {
  std::string path;                // the sweep file ("" when built in code)
  std::string base;                // run config path, resolved against the sweep file's folder
  std::string output;              // folder of run directories
  std::vector<SweepAxis> grid;     // in file order
  std::vector<std::string> fixed;  // "key=value" overrides applied before the grid's
  int64_t parallel = 1;            // runs at a time
  std::vector<int64_t> devices;    // CUDA devices to spread the runs over; empty: none pinned
  bool devices_auto = false;       // `devices: auto`: every CUDA device found when the sweep runs
  SweepLauncher launcher;

  // Loads a sweep file; `overrides` ("a.b=value") apply to the sweep file itself, e.g.
  // "output=runs/x" or "fixed.train.steps=5". Unknown keys are errors naming the key path.
  static SweepSpec Load(const std::string& path, const std::vector<std::string>& overrides = {});
  static SweepSpec FromNode(const YAML::Node& root, const std::string& origin, const std::string& folder);
};

// One grid point: its values in axis order and its run directory name.
struct SweepPoint {
  std::string name;
  std::string legacy_name;  // its name before short names (sweep_names.h), for migrating old output
  std::vector<std::pair<std::string, YAML::Node>> values;
};

// The Cartesian product of the axes (last axis fastest), each point named by RunName (every point
// by LegacyRunName where two short names would clash). Names must be unique (fails naming the
// clash otherwise).
std::vector<SweepPoint> ExpandGrid(const std::vector<SweepAxis>& grid);
// A YAML node as one line of flow YAML (what `--set key=<this>` parses back to the same node).
std::string FlowYaml(const YAML::Node& node);

// The overrides a run gets: the sweep's fixed ones, the point's values, then log.dir.
std::vector<std::string> RunOverrides(const SweepSpec& spec, const SweepPoint& point);
std::string RunDir(const SweepSpec& spec, const SweepPoint& point);


// pending: never started; partial: started, not finished (interrupted, or killed) and will be
// resumed from its checkpoint; failed: the last attempt exited with an error (retried on the next
// sweep, resuming from its checkpoint); diverged: stopped on a non-finite loss (kept as a result,
// not rerun); finished: summary.json with steps == train.steps.
enum class RunStatus { kPending, kPartial, kFailed, kDiverged, kFinished };
const char* RunStatusName(RunStatus status);
// `last_exit_code` is from sweep_state.yaml: -1 when unknown (never run by this sweep).
RunStatus ClassifyRun(const std::string& run_dir, const std::optional<RunSummary>& summary,
                      int64_t target_steps, int last_exit_code);
// The status of the run directory `run_dir` alone, as the sweep that made it would classify it:
// its summary.json, its config.yaml's train.steps, and the last exit code recorded in
// sweep_state.yaml beside it. The tools ask this (`darkformer inspect --run-status`), so the rule
// is written once.
RunStatus StatusOfRunDir(const std::string& run_dir);
// Whether the sweep (re)starts a run in this status.
bool NeedsRun(RunStatus status);

// Per-run exit codes and statuses, kept in <output>/sweep_state.yaml across sweep invocations.
struct SweepState {
  struct Entry {
    std::string status;
    int exit_code = -1;
    int attempts = 0;
  };
  std::map<std::string, Entry> runs;
  static SweepState Load(const std::string& path);  // empty when absent
  void Save(const std::string& path) const;         // written via a temp file and rename
};

// One row of the summary tables.
struct SweepRecord {
  SweepPoint point;
  std::string dir;
  int64_t target_steps = 0;
  RunStatus status = RunStatus::kPending;
  int exit_code = -1;
  std::optional<RunSummary> summary;
};
// Columns: run, one per grid key, status, exit_code, then RunSummary's fields.
void WriteSummaryCsv(const std::vector<SweepRecord>& records, const std::vector<std::string>& grid_keys,
                     const std::string& path);
void WriteSummaryMarkdown(const std::vector<SweepRecord>& records, const std::vector<std::string>& grid_keys,
                          const std::string& path, const std::string& title);

}  // namespace darkformer
