// GoogleTest entry point shared by every test binary: quiet logs, fixed thread count, MKL's
// vector-math kernels chosen before any parallel work (as darkformer's main does).
// `--skip_exit_code=N` (ctest's groups of tests, tests/gtest_groups.cmake): exit N where every test
// that ran was skipped, so ctest reports the group as skipped rather than passed.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>

#include "util/vector_math_kernels.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int skip_exit_code = 0;
  constexpr const char* kSkipFlag = "--skip_exit_code=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], kSkipFlag, std::strlen(kSkipFlag)) == 0) {
      skip_exit_code = std::atoi(argv[i] + std::strlen(kSkipFlag));
    }
  }
  torch::set_num_threads(2);
  darkformer::ChooseVectorMathKernels();
  const int result = RUN_ALL_TESTS();
  const auto* unit = ::testing::UnitTest::GetInstance();
  if (result == 0 && skip_exit_code != 0 && unit->skipped_test_count() > 0 && unit->successful_test_count() == 0) {
    return skip_exit_code;
  }
  return result;
}
