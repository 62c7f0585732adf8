// AutocastScope (util/mixed_precision.h) on the CPU: inside, a Linear computes in bf16; a weight
// updated in place inside one long scope is seen stale (autocast's cast cache: the bug a run-long
// scope had), and seen fresh by the next scope; NoAutocastGuard keeps fp32 inside a scope.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "util/mixed_precision.h"

namespace darkformer {
namespace {

TEST(AutocastScopeTest, LinearRunsInBf16InsideAndFp32Outside) {
  torch::nn::Linear linear(8, 8);
  const auto x = torch::randn({4, 8});
  {
    AutocastScope scope(torch::kCPU, true);
    EXPECT_EQ(linear(x).scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(AutocastActive(torch::kCPU));
    NoAutocastGuard fp32;
    EXPECT_EQ(linear(x).scalar_type(), torch::kFloat32);
    EXPECT_FALSE(AutocastActive(torch::kCPU));
  }
  EXPECT_EQ(linear(x).scalar_type(), torch::kFloat32);
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  AutocastScope off(torch::kCPU, false);
  EXPECT_EQ(linear(x).scalar_type(), torch::kFloat32);
}

// at::linear takes the weight leaf itself, as Python's nn.Linear does, and autocast caches its
// cast. (LibTorch's C++ Linear module multiplies by a transposed view, which autocast never
// caches, so our layers re-cast every call; the scope keeps any cached cast from outliving a
// weight update whichever path an op takes.)
TEST(AutocastScopeTest, TheCastCacheLivesAsLongAsTheOutermostScope) {
  const auto w = torch::randn({8, 8}).requires_grad_();
  const auto x = torch::randn({4, 8});
  torch::Tensor before, stale, fresh;
  {
    AutocastScope scope(torch::kCPU, true);
    before = at::linear(x, w);
    {
      torch::NoGradGuard no_grad;
      w.add_(1.0);  // an optimizer step's in-place update
    }
    {
      AutocastScope nested(torch::kCPU, true);  // an inner scope's exit keeps the outer cache
    }
    stale = at::linear(x, w);
  }
  {
    AutocastScope scope(torch::kCPU, true);
    fresh = at::linear(x, w);
  }
  EXPECT_TRUE(torch::equal(before, stale)) << "inside one scope the cached bf16 weight is reused";
  EXPECT_FALSE(torch::equal(before, fresh)) << "a new scope casts the updated weight";
}

}  // namespace
}  // namespace darkformer
