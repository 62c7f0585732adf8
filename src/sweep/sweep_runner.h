// Runs a sweep: each grid point is `<program> train --config <base> --set ...` in a child process
// (a crash of one run cannot take the sweep down), up to `parallel` at a time, each writing its
// own run directory and train.log. Finished and diverged runs are skipped, partial and failed ones
// resume from their checkpoint; exit codes go to <output>/sweep_state.yaml and the tables to
// <output>/summary.{csv,md} after every run.
#pragma once

#include <string>
#include <vector>

#include "sweep/sweep_spec.h"
#include "sweep/sweep_state.h"
#include "sweep/sweep_status.h"
#include "sweep/sweep_summary.h"

namespace darkformer {

struct SweepOptions {
  std::string program = "/proc/self/exe";  // the darkformer binary the runs are launched with
  int64_t parallel = 0;                    // runs at a time; 0 = the sweep file's `parallel`
  bool dry_run = false;                    // list the runs and their commands, launch nothing
};

// Every grid point with its target steps (from its resolved run config, which is validated
// here, before anything is launched) and its current status. Run directories of the long names
// of earlier sweeps are renamed to the short ones first (sweep_names.h), unless `look_only`
// (a dry run), which reports them where they are.
std::vector<SweepRecord> InspectSweep(const SweepSpec& spec, bool look_only = false);
// Writes <output>/summary.csv and <output>/summary.md.
void WriteSweepSummaries(const SweepSpec& spec, const std::vector<SweepRecord>& records);
// The argument vector of one run (program first).
std::vector<std::string> RunCommand(const SweepSpec& spec, const SweepPoint& point, const std::string& program);

// Runs the sweep. Returns 0 when every run finished or diverged, 1 when some failed, and 130
// when stopped by SIGINT/SIGTERM (running children are asked to checkpoint and stop).
int RunSweep(const SweepSpec& spec, const SweepOptions& options);

}  // namespace darkformer
