// Checkpoints hold everything with state: model weights (and kernel draws), the optimizer, the
// schedule position (step), RNG state, the data loader's position and the spike window. One HDF5
// file per checkpoint, written to a temporary name and renamed; the last K are kept.
//
// Layout: the model's weights as in a weights file (weights_io.h: a dataset per parameter and
// buffer, config and trainer state as attributes), the AdamW state under "trainer/adamw" (see
// optimizer_state_io.h) and the CPU generator's state as "trainer/rng_cpu". Every tensor is written
// from, and read back into, the model's and optimizer's own tensors one at a time, so a checkpoint
// of a large model costs no second copy of it in memory. Checkpoints of the earlier layout (the
// whole optimizer as one serialized archive in "trainer/optimizer") still load.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

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
  double last_loss = 0.0;      // the last step's train loss
  double final_loss = 0.0;     // summary.json's final_loss (see RunSummary)
  double best_eval_accuracy = 0.0;
  double wall_seconds = 0.0;   // accumulated over resumed segments
  std::string spike_window;    // SpikeMonitor::Serialize()
  std::string divergence;      // DivergenceDetector::Serialize()
  int64_t rewinds = 0;         // rewinds so far (train/rewind.h)
  int64_t batches_skipped = 0; // optimizer-step batches they skipped
  int64_t lr_factor_until = 0; // steps up to this one run at rewind.lr_factor times the lr
  LoaderState loader;          // stored beside the fields below, as its own YAML map

  // fn(name, field...) for the scalar fields, the one list that saving and loading share.
  template <typename Fn, typename... Self>
  static void VisitFields(Fn&& fn, Self&... self) {
    fn("step", self.step...);
    fn("tokens_seen", self.tokens_seen...);
    fn("spikes", self.spikes...);
    fn("previous_step_spiked", self.previous_step_spiked...);
    fn("skipped_updates", self.skipped_updates...);
    fn("min_loss", self.min_loss...);
    fn("last_loss", self.last_loss...);
    fn("final_loss", self.final_loss...);
    fn("best_eval_accuracy", self.best_eval_accuracy...);
    fn("wall_seconds", self.wall_seconds...);
    fn("spike_window", self.spike_window...);
    fn("divergence", self.divergence...);
    fn("rewinds", self.rewinds...);
    fn("batches_skipped", self.batches_skipped...);
    fn("lr_factor_until", self.lr_factor_until...);
  }
};

std::string CheckpointPath(const std::string& run_dir, int64_t step);
// The checkpoints of a run directory, oldest first: files named step_<digits>.h5 (temporary and
// foreign files are ignored).
std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& run_dir);
// The newest of them, if any.
std::optional<std::string> LatestCheckpoint(const std::string& run_dir);

void SaveCheckpoint(const std::string& path, GemmaModelImpl& model, torch::optim::Optimizer& optimizer,
                    const TrainerState& state, const std::string& attention_yaml);
// Restores model, optimizer, RNG and returns the trainer state.
TrainerState LoadCheckpoint(const std::string& path, GemmaModelImpl& model, torch::optim::Optimizer& optimizer);
// Deletes temporary files that a checkpoint write killed midway left behind.
void RemoveStaleCheckpointFiles(const std::string& run_dir);

}  // namespace darkformer
