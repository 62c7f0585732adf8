// A run's status (see sweep_status.h).
#include "sweep/sweep_status.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>

#include "sweep/sweep_state.h"
#include "train/train_config.h"

namespace darkformer {

namespace fs = std::filesystem;

const char* RunStatusName(RunStatus status) {
  switch (status) {
    case RunStatus::kPending: return "pending";
    case RunStatus::kPartial: return "partial";
    case RunStatus::kFailed: return "failed";
    case RunStatus::kDiverged: return "diverged";
    case RunStatus::kFinished: return "finished";
  }
  return "unknown";
}

RunStatus ClassifyRun(const std::string& run_dir, const std::optional<RunSummary>& summary, int64_t target_steps,
                      int last_exit_code) {
  if (summary && summary->diverged) return RunStatus::kDiverged;
  if (summary && summary->steps >= target_steps) return RunStatus::kFinished;
  if (last_exit_code > 0 && last_exit_code != 130) return RunStatus::kFailed;
  if (summary || fs::exists(fs::path(run_dir) / "checkpoints") || fs::exists(fs::path(run_dir) / "metrics.jsonl")) {
    return RunStatus::kPartial;
  }
  return RunStatus::kPending;
}

RunStatus StatusOfRunDir(const std::string& run_dir) {
  const fs::path dir = fs::path(run_dir).lexically_normal();
  const fs::path run = dir.has_filename() ? dir : dir.parent_path();  // "a/b/" names b
  int64_t target_steps = TrainConfig().steps;
  try {
    const auto config = YAML::LoadFile((run / "config.yaml").string());
    if (config["train"] && config["train"]["steps"]) target_steps = config["train"]["steps"].as<int64_t>();
  } catch (const YAML::Exception&) {
    // No readable config.yaml: a run that never started (pending) or not ours; the default stands.
  }
  const auto state = SweepState::Load((run.parent_path() / "sweep_state.yaml").string());
  const auto it = state.runs.find(run.filename().string());
  return ClassifyRun(run.string(), ReadRunSummary(run.string()), target_steps,
                     it == state.runs.end() ? -1 : it->second.exit_code);
}

bool NeedsRun(RunStatus status) { return status != RunStatus::kFinished && status != RunStatus::kDiverged; }

}  // namespace darkformer
