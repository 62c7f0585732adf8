// Learning-rate schedules as small named functions of the step (llm.c style).
#pragma once

#include <cmath>
#include <cstdint>

#include "train/train_config.h"

namespace darkformer {

// Linear warmup from lr/warmup to lr over `warmup` steps (step is 0-based).
inline double WarmupFactor(int64_t step, int64_t warmup) {
  return warmup > 0 && step < warmup ? static_cast<double>(step + 1) / static_cast<double>(warmup) : 1.0;
}

// Fraction of the decay phase done at `step`, in [0, 1].
inline double DecayProgress(int64_t step, int64_t begin, int64_t end) {
  if (end <= begin) return 1.0;
  const double p = static_cast<double>(step - begin) / static_cast<double>(end - begin);
  return p < 0 ? 0.0 : (p > 1 ? 1.0 : p);
}

// lr at 0-based `step` of `total` steps for the named schedule.
inline double ScheduledLr(LrSchedule schedule, double lr, int64_t step, int64_t total, int64_t warmup,
                          double min_ratio, double decay_fraction) {
  const double min_lr = lr * min_ratio;
  if (step < warmup) return lr * WarmupFactor(step, warmup);
  if (schedule == LrSchedule::kConstant) return lr;
  if (schedule == LrSchedule::kCosine) {
    const double p = DecayProgress(step, warmup, total - 1);
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * p));
  }
  if (schedule == LrSchedule::kLinear) return lr - (lr - min_lr) * DecayProgress(step, warmup, total - 1);
  // wsd: stable at lr, then linear decay over the last decay_fraction of the steps.
  const auto decay_begin = static_cast<int64_t>(std::llround(static_cast<double>(total) * (1.0 - decay_fraction)));
  return lr - (lr - min_lr) * DecayProgress(step, decay_begin < warmup ? warmup : decay_begin, total - 1);
}

}  // namespace darkformer
