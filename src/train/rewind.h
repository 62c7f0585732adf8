// A rewind (train.spikes.on_divergence: rewind), PaLM's remedy for a diverged run: reload the
// newest checkpoint at least rewind.min_steps_back steps before the episode's first bad step, skip
// the data from that checkpoint's position to rewind.skip_batches past the batches the run had
// read, and go on (with the lr times rewind.lr_factor for rewind.lr_steps steps). The rules here
// are pure; the trainer applies them (trainer_rewind.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/batch_source.h"
#include "train/train_config.h"

namespace darkformer {

using CheckpointList = std::vector<std::pair<int64_t, std::string>>;  // (step, path), oldest first

// The newest checkpoint whose step is at most first_bad - 2 - min_steps_back; none when every one
// is later. A checkpoint of step c holds the weights after update c. The first bad loss, at step
// f, was computed with the weights after update f - 1, the update that may have done the damage
// (a spike's loss rises the step after its update), so the state to return to is the one before
// that update: c <= f - 2.
std::optional<std::pair<int64_t, std::string>> RewindTarget(const CheckpointList& checkpoints, int64_t first_bad,
                                                           int64_t min_steps_back);

// Micro-batches a loader has handed out since its first epoch began.
int64_t MicroBatchesRead(const LoaderState& position);
// `position` moved on by `micro_batches`, across epochs as Next() would.
LoaderState AdvancedBy(const LoaderState& position, int64_t micro_batches);

// The checkpoints to delete after one at `step` is written: all but the keep_last newest, except,
// with rewinds on, those a later divergence could rewind to. A divergence declared at a later
// step has its first bad step within max(divergence.window, consecutive_skips) steps of it: the
// checkpoint RewindTarget would pick for the earliest such step and every newer one stay.
std::vector<std::string> CheckpointsToPrune(const CheckpointList& checkpoints, int64_t step, const TrainConfig& train);

}  // namespace darkformer
