// A run's summary.json: what a finished (or stopped) run reports, read back by the sweep runner
// for its tables. The fields are listed once, in VisitFields.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/json.h"

namespace darkformer {

struct RunSummary {
  int64_t steps = 0;                // optimizer steps completed
  int64_t tokens_seen = 0;
  double final_loss = 0.0;          // the last eval's loss at the last step, else the last step's train loss
  double min_loss = 0.0;            // lowest finite train loss
  double best_eval_accuracy = 0.0;
  int64_t spikes = 0;               // spike events
  int64_t skipped_updates = 0;
  bool diverged = false;            // stopped on a non-finite loss or a declared divergence
  double wall_seconds = 0.0;        // over all resumed segments
  double mean_tokens_per_s = 0.0;   // over the steps of the last segment
  double mean_mfu = 0.0;            // over the steps of the last segment; 0 when no peak is known
  int64_t peak_memory_bytes = 0;    // the last segment's peak: CUDA allocated on a GPU, RSS on the CPU
  std::string kernel;               // attention.kernel
  int64_t rewinds = 0;              // train.spikes.on_divergence: rewind (train/rewind.h)
  int64_t batches_skipped = 0;      // optimizer-step batches the rewinds skipped

  // fn(name, field..., decimals): decimals is how tables print a double (ignored for others).
  template <typename Fn, typename... Self>
  static void VisitFields(Fn&& fn, Self&... self) {
    fn("steps", self.steps..., 0);
    fn("tokens_seen", self.tokens_seen..., 0);
    fn("final_loss", self.final_loss..., 4);
    fn("min_loss", self.min_loss..., 4);
    fn("best_eval_accuracy", self.best_eval_accuracy..., 4);
    fn("spikes", self.spikes..., 0);
    fn("skipped_updates", self.skipped_updates..., 0);
    fn("diverged", self.diverged..., 0);
    fn("rewinds", self.rewinds..., 0);
    fn("batches_skipped", self.batches_skipped..., 0);
    fn("wall_seconds", self.wall_seconds..., 1);
    fn("mean_tokens_per_s", self.mean_tokens_per_s..., 1);
    fn("mean_mfu", self.mean_mfu..., 4);
    fn("peak_memory_bytes", self.peak_memory_bytes..., 0);
    fn("kernel", self.kernel..., 0);
  }

  Json ToJson() const;
  // Absent or null (non-finite) fields keep their defaults.
  static RunSummary FromJson(const Json& json);
  // The field names, and this summary's values as table cells, in VisitFields order.
  static std::vector<std::string> ColumnNames();
  std::vector<std::string> Cells() const;
};

// <run_dir>/summary.json, if present and readable (a torn write reads as absent: the run resumes).
std::optional<RunSummary> ReadRunSummary(const std::string& run_dir);

}  // namespace darkformer
