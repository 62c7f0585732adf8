// Throughput, MFU and memory peaks of the steps (see step_metrics.h).
#include "train/step_metrics.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace darkformer {

StepMetrics::StepMetrics(GemmaModelImpl& model, int64_t seq_len, const torch::Device& device,
                         double configured_peak_tflops)
    : flops_(CountModelFlops(model, seq_len)), memory_(std::make_unique<StepMemory>(device)) {
  memory_->ReadAndReset();  // the peaks from here on
  const std::string name = memory_->DeviceName();
  peak_flops_ = PeakFlops(configured_peak_tflops, name);
  spdlog::info("model FLOPs per token {:.3g} (matmul weights {}, {} trainable; attention {:.3g} forward); MFU {}",
               flops_.per_token, flops_.matmul_weights, flops_.trainable_matmul_weights,
               flops_.attention_forward_per_token,
               peak_flops_ > 0 ? fmt::format("against {:.0f} TFLOP/s ({})", peak_flops_ / 1e12, name)
                               : std::string("not reported: set train.peak_tflops (no known peak for " + name + ")"));
}

void StepMetrics::Count(int64_t tokens, double step_ms) {
  tokens_ += static_cast<double>(tokens);
  seconds_ += step_ms / 1000.0;
}

StepMetrics::Row StepMetrics::Measure(int64_t tokens, double step_ms) {
  Row row;
  row.tokens_per_s = static_cast<double>(tokens) / (step_ms / 1000.0);
  // This step's model FLOP/s per device (tokens are this rank's).
  if (peak_flops_ > 0) {
    row.mfu = flops_.per_token * row.tokens_per_s / peak_flops_;
    mfu_sum_ += row.mfu;
    ++mfu_steps_;
  }
  row.peaks = memory_->ReadAndReset();
  const int64_t device_peak = row.peaks.cuda_allocated >= 0 ? row.peaks.cuda_allocated : row.peaks.rss;
  run_peak_memory_ = std::max(run_peak_memory_, device_peak);
  line_peak_memory_ = std::max(line_peak_memory_, device_peak);
  return row;
}

int64_t StepMetrics::TakeLinePeak() {
  const int64_t peak = line_peak_memory_;
  line_peak_memory_ = 0;
  return peak;
}

}  // namespace darkformer
