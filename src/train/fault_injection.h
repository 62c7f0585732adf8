// train.fault_injection as one object the train loop asks at its hook points: faults injected on
// purpose so tests can prove the spike, non-finite, interruption and rewind paths. With the keys
// unset (every real run) each hook leaves things as they are.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "train/train_config.h"

namespace darkformer {

class FaultInjection {
 public:
  FaultInjection(const FaultInjectionConfig& config, int64_t rank) : config_(config), rank_(rank) {}

  // lr_multiplier_at_step: the factor on the lr of a step that trains on data batch `data_batch`
  // (1-based). Keyed to the batch, not the step: a rewind skips the batch, and the fault with it.
  double LrFactor(int64_t data_batch) const;
  // nan_loss_at_step / nan_loss_rank: this replica's loss at `step`, made NaN there.
  torch::Tensor Loss(const torch::Tensor& loss, int64_t step) const;
  // stop_at_step: the run stops after `step` as on SIGTERM (checkpoint, exit 130).
  bool StopsAfter(int64_t step) const { return config_.stop_at_step == step; }
  // kill_in_rewind: the process dies here as under kill -9, at `phase` of the first rewind.
  void AtRewindPhase(int64_t phase, int64_t rewinds_before) const;

 private:
  FaultInjectionConfig config_;
  int64_t rank_;
};

}  // namespace darkformer
