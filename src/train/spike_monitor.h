// Loss-spike detection: rolling-window z-scores of loss and grad norm, plus a ratio to the
// recent minimum loss (a step well above the best recent loss is a spike even if noisy); every
// flag also needs an absolute rise of the loss over the window mean (train.spikes.min_loss_increase).
#pragma once

#include <deque>
#include <string>

#include "train/train_config.h"

namespace darkformer {

struct SpikeVerdict {
  bool spike = false;
  double loss_z = 0.0, grad_norm_z = 0.0;
  double loss_mean = 0.0, loss_std = 0.0;
  double grad_norm_mean = 0.0, grad_norm_std = 0.0;
  double loss_ratio_to_min = 0.0;
  std::string reason;  // "loss_z", "grad_norm_z", "min_loss_ratio" (comma-joined)
};

class SpikeMonitor {
 public:
  explicit SpikeMonitor(const SpikeConfig& config) : config_(config) {}
  // Scores this step against the window (before adding it), then adds it unless it was a spike,
  // so one spike does not inflate the baseline for the next.
  SpikeVerdict Observe(double loss, double grad_norm);
  // The window, for checkpoints: "loss,grad;loss,grad;...".
  std::string Serialize() const;
  void Restore(const std::string& text);

 private:
  SpikeConfig config_;
  std::deque<std::pair<double, double>> window_;
};

}  // namespace darkformer
