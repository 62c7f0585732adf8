// GoogleTest entry point shared by every test binary: quiet logs, fixed thread count, MKL's
// vector-math kernels chosen before any parallel work (as darkformer's main does).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "util/vector_math_kernels.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  torch::set_num_threads(2);
  darkformer::ChooseVectorMathKernels();
  return RUN_ALL_TESTS();
}
