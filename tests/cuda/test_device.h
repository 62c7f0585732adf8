// The device the `cuda`-labelled tests run on: DARKFORMER_TEST_DEVICE=cuda runs them on the GPU
// (TF32 off, so fp32 means fp32), unset or `cpu` on the CPU. Asking for CUDA where there is none,
// or for any other device, ends the test binary with exit code 2: never a silent skip.
#pragma once

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace darkformer::testing {

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
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  return torch::kCUDA;
}

// The device's name for the train config's `train.device`.
inline std::string TestDeviceKey() { return TestDevice().is_cuda() ? "cuda" : "cpu"; }

}  // namespace darkformer::testing
