// When a run has diverged (train.spikes.divergence): any one of N flagged steps within a window of
// W steps, a non-finite loss or grad norm, or K skipped updates in a row. The detector sees each
// step's verdicts in order and declares the divergence with the episode's first bad step, the
// step a rewind must go back before (train/rewind.h). Its state is saved in checkpoints, so a
// resumed run declares exactly what the uninterrupted one would.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "train/train_config.h"

namespace darkformer {

struct Divergence {
  int64_t declared_at = 0;  // the step that completed a rule
  int64_t first_bad = 0;    // the episode's first flagged, non-finite or skipped step
  std::string rule;         // which rule, in words
};

class DivergenceDetector {
 public:
  explicit DivergenceDetector(const SpikeConfig::Divergence& rules) : rules_(rules) {}
  // After optimizer step `step` (1-based): whether it was flagged a spike, skipped its update, and
  // had a finite loss and grad norm. A declared episode is forgotten: the next one starts afresh.
  std::optional<Divergence> Observe(int64_t step, bool spike, bool skipped, bool finite);
  // "s1,s2,...;first_skip,skips_in_row" for checkpoints; Restore("") is a fresh detector.
  std::string Serialize() const;
  void Restore(const std::string& text);

 private:
  SpikeConfig::Divergence rules_;
  std::deque<int64_t> spikes_;  // flagged steps within the window, oldest first
  int64_t first_skip_ = 0, skips_in_row_ = 0;
};

}  // namespace darkformer
