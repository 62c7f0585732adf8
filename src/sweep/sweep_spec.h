// Sweeps: a grid over run-config keys applied to a base run config. This file holds the sweep
// file and its grid: the points, their run directories and the overrides each run gets. Beside it:
// sweep_names.h (run names), sweep_state.h (per-run exit codes), sweep_status.h (a run's status),
// sweep_summary.h (the tables) and sweep_runner.h (launching the runs).
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
#include <string>
#include <utility>
#include <vector>

#include "sweep/sweep_names.h"

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

// The overrides a run gets: the sweep's fixed ones, the point's values, then log.dir.
std::vector<std::string> RunOverrides(const SweepSpec& spec, const SweepPoint& point);
std::string RunDir(const SweepSpec& spec, const SweepPoint& point);

}  // namespace darkformer
