// The spike monitor's absolute floor: near zero loss, relative noise (1e-4 -> 3e-4, a ratio of 3 to
// the minimum and a large z-score) is not a spike, while a real jump is.
#include <gtest/gtest.h>

#include <cmath>

#include "train/spike_monitor.h"

namespace darkformer {
namespace {

TEST(SpikeMonitorTest, RelativeNoiseNearZeroLossIsNotASpike) {
  SpikeConfig config;
  config.window = 20;
  config.min_history = 10;
  SpikeMonitor monitor(config);
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(monitor.Observe(1e-4 * (1 + 0.1 * std::sin(i)), 0.01).spike);
  const auto noise = monitor.Observe(3e-4, 0.05);
  EXPECT_GT(noise.loss_z, config.loss_z);                    // relative criteria would fire ...
  EXPECT_GT(noise.loss_ratio_to_min, config.min_loss_ratio);
  EXPECT_FALSE(noise.spike);                                 // ... but the loss rose by 2e-4 nats only
  const auto jump = monitor.Observe(0.5, 3.0);
  EXPECT_TRUE(jump.spike);
  EXPECT_NE(jump.reason.find("loss_z"), std::string::npos);
}

TEST(SpikeMonitorTest, ZeroFloorKeepsTheRelativeCriteria) {
  SpikeConfig config;
  config.window = 20;
  config.min_history = 10;
  config.min_loss_increase = 0.0;
  SpikeMonitor monitor(config);
  for (int i = 0; i < 20; ++i) monitor.Observe(1e-4 * (1 + 0.1 * std::sin(i)), 0.01);
  EXPECT_TRUE(monitor.Observe(3e-4, 0.01).spike);
}

}  // namespace
}  // namespace darkformer
