// Step traces with LibTorch's profiler (see step_profiler.h).
#include "train/step_profiler.h"

#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <filesystem>
#include <set>

namespace darkformer {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

StepProfiler::StepProfiler(int64_t start_step, int64_t steps, const torch::Device& device, std::string run_dir)
    : first_(start_step), last_(steps > 0 ? start_step + steps - 1 : start_step - 1), device_(device),
      run_dir_(std::move(run_dir)) {}

StepProfiler::~StepProfiler() {
  if (active_) prof::disableProfiler();  // a run stopped inside the window: nothing to write
}

void StepProfiler::BeforeStep(int64_t step) {
  if (step != first_ || last_ < first_ || active_) return;
  std::set<ActivityType> activities = {ActivityType::CPU};
  if (device_.is_cuda()) activities.insert(ActivityType::CUDA);
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true, /*profile_memory=*/true);
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  active_ = true;
}

std::string StepProfiler::AfterStep(int64_t step) {
  if (!active_ || step != last_) return "";
  const auto result = prof::disableProfiler();
  active_ = false;
  const auto path = (std::filesystem::path(run_dir_) /
                     ("trace_steps_" + std::to_string(first_) + "-" + std::to_string(last_) + ".json"))
                        .string();
  result->save(path);
  spdlog::info("profiler trace of steps {}-{}: {}", first_, last_, path);
  return path;
}

}  // namespace darkformer
