// A sweep's tables, one row per run: <output>/summary.csv and summary.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sweep/sweep_spec.h"
#include "sweep/sweep_status.h"
#include "train/run_summary.h"

namespace darkformer {

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
