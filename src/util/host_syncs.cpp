// Host-sync counting (see host_syncs.h).
#include "util/host_syncs.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <set>

namespace darkformer {

bool IsHostSyncCall(const std::string& name) {
  static const std::set<std::string> names = {
      "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D",
      "cudaMemcpyFromSymbol",  "cuCtxSynchronize",      "cuStreamSynchronize",  "cuEventSynchronize"};
  return names.count(name) > 0;
}

std::optional<int64_t> CountHostSyncs(const std::function<void()>& fn) {
  if (!torch::cuda::is_available()) return std::nullopt;
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  const std::set<ActivityType> activities = {ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(ProfilerConfig(ProfilerState::KINETO), activities);
  prof::enableProfiler(ProfilerConfig(ProfilerState::KINETO), activities);
  fn();  // no synchronisation of ours inside the window: only fn's own are counted
  const auto result = prof::disableProfiler();
  int64_t syncs = 0;
  for (const auto& e : result->events()) syncs += IsHostSyncCall(e.name()) ? 1 : 0;
  return syncs;
}

}  // namespace darkformer
