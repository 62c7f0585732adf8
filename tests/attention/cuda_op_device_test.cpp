// Which GPUs the CUDA operator runs on (ops/cuda_op_device.h): CUDA's compatibility rule for code
// compiled as each architecture's own code plus PTX (the CUDA C++ Programming Guide, "Binary
// Compatibility" and "PTX Compatibility"), and this build's list of architectures.
#include <gtest/gtest.h>

#include "attention/ops/cuda_op_device.h"

namespace darkformer {
namespace {

TEST(CudaOpDevice, OwnCodeRunsOnLaterMinorsOfItsMajorAndPtxOnLaterDevices) {
  const std::vector<int> ampere_hopper = {80, 90};
  EXPECT_TRUE(CudaOpRunsOn(ampere_hopper, 8, 0));    // A100
  EXPECT_TRUE(CudaOpRunsOn(ampere_hopper, 8, 6));    // A10, RTX 30xx: sm_80 code
  EXPECT_TRUE(CudaOpRunsOn(ampere_hopper, 8, 9));    // L4, L40S, RTX 40xx
  EXPECT_TRUE(CudaOpRunsOn(ampere_hopper, 9, 0));    // H100, H200
  EXPECT_TRUE(CudaOpRunsOn(ampere_hopper, 10, 0));   // B200: PTX
  EXPECT_TRUE(CudaOpRunsOn(ampere_hopper, 12, 0));   // RTX 50xx: PTX
  EXPECT_FALSE(CudaOpRunsOn(ampere_hopper, 7, 5));   // T4: below every architecture
  EXPECT_FALSE(CudaOpRunsOn(ampere_hopper, 7, 0));   // V100
  const std::vector<int> hopper_only = {90};         // this project's list before 80 was added
  EXPECT_FALSE(CudaOpRunsOn(hopper_only, 8, 0));
  EXPECT_FALSE(CudaOpRunsOn(hopper_only, 8, 9));
  EXPECT_TRUE(CudaOpRunsOn(hopper_only, 9, 0));
  EXPECT_FALSE(CudaOpRunsOn({}, 9, 0));              // a build without the kernels
}

TEST(CudaOpDevice, TheBuildsArchitecturesAreWhatItsKernelsAreFor) {
#ifdef DARKFORMER_CUDA_OP
  const auto architectures = CudaOpArchitectures();
  ASSERT_FALSE(architectures.empty());
  for (int a : architectures) EXPECT_GE(a, 10) << "CMake's form: 80 for sm_80";
#else
  EXPECT_TRUE(CudaOpArchitectures().empty());
  EXPECT_NE(CudaOpDeviceProblem(0).find("no CUDA kernels"), std::string::npos);
#endif
}

}  // namespace
}  // namespace darkformer
