// The rules of a rewind (see rewind.h).
#include "train/rewind.h"

#include <algorithm>

#include "util/error.h"

namespace darkformer {

std::optional<std::pair<int64_t, std::string>> RewindTarget(const CheckpointList& checkpoints, int64_t first_bad,
                                                           int64_t min_steps_back) {
  std::optional<std::pair<int64_t, std::string>> target;
  for (const auto& checkpoint : checkpoints) {
    if (checkpoint.first <= first_bad - 2 - min_steps_back) target = checkpoint;  // oldest first: the last wins
  }
  return target;
}

int64_t MicroBatchesRead(const LoaderState& position) {
  return position.epoch * position.batches_per_epoch + position.step;
}

LoaderState AdvancedBy(const LoaderState& position, int64_t micro_batches) {
  DF_CHECK(position.batches_per_epoch > 0 && micro_batches >= 0,
           "cannot advance a loader of " << position.batches_per_epoch << " batches per epoch by " << micro_batches);
  const int64_t read = MicroBatchesRead(position) + micro_batches;
  LoaderState moved = position;
  moved.epoch = read / position.batches_per_epoch;
  moved.step = read % position.batches_per_epoch;
  return moved;
}

std::vector<std::string> CheckpointsToPrune(const CheckpointList& checkpoints, int64_t step, const TrainConfig& train) {
  const int64_t keep_last = train.keep_last;
  const size_t kept_by_count = std::min<size_t>(checkpoints.size(), static_cast<size_t>(std::max<int64_t>(keep_last, 0)));
  size_t first_kept = checkpoints.size() - kept_by_count;
  if (train.spikes.on_divergence == DivergenceAction::kRewind) {
    const auto& rules = train.spikes.divergence;
    const int64_t reach = std::max({rules.window, rules.consecutive_skips, int64_t{1}});
    const int64_t earliest_first_bad = step + 2 - reach;  // a divergence declared at step + 1 or later
    if (const auto target = RewindTarget(checkpoints, earliest_first_bad, train.spikes.rewind.min_steps_back)) {
      for (size_t i = 0; i < checkpoints.size(); ++i) {
        if (checkpoints[i].first == target->first) first_kept = std::min(first_kept, i);
      }
    } else {
      first_kept = 0;  // none is old enough yet: every one may still be the target
    }
  }
  std::vector<std::string> pruned;
  for (size_t i = 0; i < first_kept; ++i) pruned.push_back(checkpoints[i].second);
  return pruned;
}

}  // namespace darkformer
