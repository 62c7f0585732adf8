// cuBLAS's workspaces, which PyTorch takes from the CUDA caching allocator and keeps: one per
// (cuBLAS handle, stream), so one for the forward's thread and one for autograd's device thread.
// At small shapes they are a large part of the allocator's peak (64 MiB on an H200, measured by
// tests/cuda/memory_estimate_test.cpp), so the memory estimate counts them on a GPU.
#pragma once

#include <cstdint>

namespace darkformer {

// Bytes of one workspace: the current GPU's, as PyTorch chooses it, where CUDA is available;
// otherwise PyTorch's rule without a GPU to ask: CUBLAS_WORKSPACE_CONFIG (":KiB:count" pairs,
// summed) if set, else its default for Hopper and later (4096 KiB x 8 = 32 MiB).
int64_t CublasWorkspaceBytes();

// Handles that own one during training: the forward's thread and autograd's device thread.
inline constexpr int64_t kCublasHandlesInTraining = 2;

}  // namespace darkformer
