// The device the `cuda`-labelled tests run on: DARKFORMER_TEST_DEVICE=cuda runs them on the GPU
// (TF32 off, so fp32 means fp32), unset or `cpu` on the CPU. Asking for CUDA where there is none,
// or for any other device, ends the test binary with exit code 2: never a silent skip.
#pragma once

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace darkformer::testing {

// Whether a Tf32Scope (below) is open.
inline bool& Tf32ScopeHolds() {
  static bool holds = false;
  return holds;
}

inline torch::Device TestDevice() {
  const char* env = std::getenv("DARKFORMER_TEST_DEVICE");
  const std::string name = env ? env : "cpu";
  if (name == "cpu") return torch::kCPU;
  if (name != "cuda") {
    std::fprintf(stderr, "DARKFORMER_TEST_DEVICE=%s: expected cpu or cuda\n", name.c_str());
    std::exit(2);
  }
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "DARKFORMER_TEST_DEVICE=cuda, but no CUDA device is available to this build\n");
    std::exit(2);
  }
  // Off on every call (a training run's ApplyTf32 turns it on), unless a test's Tf32Scope holds.
  if (!Tf32ScopeHolds()) {
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
  }
  return torch::kCUDA;
}

// TF32 in CUDA's fp32 products as a training run sets it (train.tf32, ApplyTf32) for the scope,
// TestDevice's calls inside it included; off again after it, as TestDevice leaves it.
struct Tf32Scope {
  explicit Tf32Scope(bool on) {
    Tf32ScopeHolds() = true;
    Set(on);
  }
  ~Tf32Scope() {
    Tf32ScopeHolds() = false;
    Set(false);
  }
  Tf32Scope(const Tf32Scope&) = delete;
  Tf32Scope& operator=(const Tf32Scope&) = delete;
  static void Set(bool on) {
    at::globalContext().setAllowTF32CuBLAS(on);
    at::globalContext().setAllowTF32CuDNN(on);
  }
};

// The device's name for the train config's `train.device`.
inline std::string TestDeviceKey() { return TestDevice().is_cuda() ? "cuda" : "cpu"; }

}  // namespace darkformer::testing
