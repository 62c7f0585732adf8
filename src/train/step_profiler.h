// train.profile: LibTorch's Kineto profiler around chosen optimizer steps, written as a Chrome
// trace (chrome://tracing, https://ui.perfetto.dev, or TensorBoard's profile plugin) into the run
// directory: trace_steps_<first>-<last>.json. CPU activities, and CUDA kernels on a GPU.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace darkformer {

class StepProfiler {
 public:
  // Off when steps == 0.
  StepProfiler(int64_t start_step, int64_t steps, const torch::Device& device, std::string run_dir);
  ~StepProfiler();
  // Around optimizer step `step` (1-based): starts before the first profiled step, and after the
  // last one stops and writes the trace (its path is returned; "" otherwise).
  void BeforeStep(int64_t step);
  std::string AfterStep(int64_t step);

 private:
  int64_t first_, last_;
  torch::Device device_;
  std::string run_dir_;
  bool active_ = false;
};

}  // namespace darkformer
