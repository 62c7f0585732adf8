// The status of a sweep's run from its directory: pending, partial, failed, diverged or finished.
// The one rule the sweep, `darkformer inspect --run-status` and the tools (through it) apply.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "train/run_summary.h"

namespace darkformer {

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

}  // namespace darkformer
