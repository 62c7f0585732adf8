// cuBLAS workspace size (see cublas_workspace.h).
#include "train/cublas_workspace.h"

#include <ATen/cuda/CUDAContextLight.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <sstream>
#include <string>

namespace darkformer {

namespace {

// PyTorch's parse of CUBLAS_WORKSPACE_CONFIG: ":SIZE_KiB:COUNT" repeated; 0 if it does not parse.
int64_t ParseWorkspaceConfig(const std::string& text) {
  std::istringstream in(text);
  int64_t total = 0;
  char colon = 0;
  while (in >> colon) {
    int64_t kib = 0, count = 0;
    char second = 0;
    if (colon != ':' || !(in >> kib >> second >> count) || second != ':' || kib < 0 || count < 0) return 0;
    total += kib * 1024 * count;
  }
  return total;
}

}  // namespace

int64_t CublasWorkspaceBytes() {
  if (torch::cuda::is_available()) return static_cast<int64_t>(at::cuda::getChosenWorkspaceSize());
  if (const char* config = std::getenv("CUBLAS_WORKSPACE_CONFIG")) {
    if (const int64_t bytes = ParseWorkspaceConfig(config); bytes > 0) return bytes;
  }
  return int64_t{4096} * 1024 * 8;
}

}  // namespace darkformer
