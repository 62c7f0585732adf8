// The test hooks of train.fault_injection (see fault_injection.h).
#include "train/fault_injection.h"

#include <csignal>
#include <limits>

namespace darkformer {

double FaultInjection::LrFactor(int64_t data_batch) const {
  const auto& f = config_;
  const bool inside = f.lr_multiplier_step > 0 && data_batch >= f.lr_multiplier_step &&
                      data_batch < f.lr_multiplier_step + f.lr_multiplier_steps;
  return inside ? f.lr_multiplier_factor : 1.0;
}

torch::Tensor FaultInjection::Loss(const torch::Tensor& loss, int64_t step) const {
  const bool here = config_.nan_loss_at_step == step && (config_.nan_loss_rank < 0 || config_.nan_loss_rank == rank_);
  return here ? loss * std::numeric_limits<double>::quiet_NaN() : loss;
}

void FaultInjection::AtRewindPhase(int64_t phase, int64_t rewinds_before) const {
  if (config_.kill_in_rewind == phase && rewinds_before == 0) std::raise(SIGKILL);
}

}  // namespace darkformer
