// Host syncs of a piece of code on a CUDA device, counted with LibTorch's profiler (Kineto's CUDA
// runtime activity): the runtime calls after which the host has waited for the device. The goal
// "0 host syncs per call" of the CUDA operator (issue 53) is measured with it: kernel-check's
// --profile rows and tests/cuda/device_cuda_op_test.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace darkformer {

// Whether a CUDA runtime call of this name makes the host wait for the device: the explicit
// synchronisations, and the copies that are synchronous for the host (cudaMemcpy; a tensor read on
// the host, `.item()`, is cudaMemcpyAsync then cudaStreamSynchronize, so it counts once).
bool IsHostSyncCall(const std::string& name);

// Runs fn once under the profiler and counts its host syncs; nullopt where nothing can wait for a
// device (no CUDA device: the profiler records no CUDA runtime calls there).
std::optional<int64_t> CountHostSyncs(const std::function<void()>& fn);

}  // namespace darkformer
