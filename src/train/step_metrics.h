// The run's throughput, MFU and memory peaks, kept apart from the loop (as torchtitan's
// MetricsProcessor): the trainer reports each step's tokens and time; this gives the row's
// tokens/s, model FLOP/s against the device's peak (train/model_flops.h) and the memory peaks
// since the last row (train/step_memory.h), and the run's means and peak for summary.json.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "model/gemma_model.h"
#include "train/model_flops.h"
#include "train/step_memory.h"

namespace darkformer {

class StepMetrics {
 public:
  // Counts the model's FLOPs per token at `seq_len`, looks up the device's peak (or takes
  // `configured_peak_tflops`), starts the memory peaks from here, and logs what it found.
  StepMetrics(GemmaModelImpl& model, int64_t seq_len, const torch::Device& device, double configured_peak_tflops);

  // Every step on every rank: the tokens and time behind the run's mean tokens/s.
  void Count(int64_t tokens, double step_ms);

  // A metrics row's numbers (rank 0): this step's throughput and MFU, and the memory peaks since
  // the last row, which also raise the run's and the step line's peaks.
  struct Row {
    double tokens_per_s = 0.0;
    double mfu = 0.0;         // 0 when the peak is unknown (has_mfu() false)
    MemoryPeaks peaks;
  };
  Row Measure(int64_t tokens, double step_ms);

  bool has_mfu() const { return peak_flops_ > 0; }
  const ModelFlops& flops() const { return flops_; }
  // The peak since the last step line (bytes: CUDA allocated on a GPU, RSS on the CPU), reset.
  int64_t TakeLinePeak();
  double mean_tokens_per_s() const { return seconds_ > 0 ? tokens_ / seconds_ : 0.0; }
  double mean_mfu() const { return mfu_steps_ > 0 ? mfu_sum_ / static_cast<double>(mfu_steps_) : 0.0; }
  int64_t run_peak_memory() const { return run_peak_memory_; }

 private:
  ModelFlops flops_;
  double peak_flops_ = 0.0;  // 0: MFU unknown
  std::unique_ptr<StepMemory> memory_;
  double tokens_ = 0.0, seconds_ = 0.0;  // this process's steps, for tokens/s
  double mfu_sum_ = 0.0;
  int64_t mfu_steps_ = 0;
  int64_t run_peak_memory_ = 0, line_peak_memory_ = 0;
};

}  // namespace darkformer
