// Checkpoints hold everything with state: model weights (and kernel draws), the optimizer, the
// schedule position (step), RNG state, the data loader's position and the spike window. One HDF5
// file per checkpoint, written to a temporary name and renamed; the last K are kept.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

#include "data/packed_loader.h"
#include "model/gemma_model.h"

namespace darkformer {

struct TrainerState {
  int64_t step = 0;            // optimizer steps completed
  int64_t tokens_seen = 0;
  int64_t spikes = 0;          // spike events: runs of consecutive flagged steps
  bool previous_step_spiked = false;
  int64_t skipped_updates = 0;
  double min_loss = 0.0;
  double best_eval_accuracy = 0.0;
  double wall_seconds = 0.0;   // accumulated over resumed segments
  LoaderState loader;
  std::string spike_window;    // SpikeMonitor::Serialize()
};

std::string CheckpointPath(const std::string& run_dir, int64_t step);
// The newest complete checkpoint of a run directory, if any (temporary files are ignored).
std::optional<std::string> LatestCheckpoint(const std::string& run_dir);

void SaveCheckpoint(const std::string& path, GemmaModelImpl& model, torch::optim::Optimizer& optimizer,
                    const TrainerState& state, const std::string& attention_yaml);
// Restores model, optimizer, RNG and returns the trainer state.
TrainerState LoadCheckpoint(const std::string& path, GemmaModelImpl& model, torch::optim::Optimizer& optimizer);
// Deletes all but the newest `keep` checkpoints.
void PruneCheckpoints(const std::string& run_dir, int64_t keep);
// Deletes temporary files that a checkpoint write killed midway left behind.
void RemoveStaleCheckpointFiles(const std::string& run_dir);

}  // namespace darkformer
