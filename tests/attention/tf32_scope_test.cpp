// The operator's LibTorch forms, and op: cuda's LibTorch side (emulated here: cuda_op_emulated.h),
// run with TF32 off under a run's TF32 (ops/fp32_products.h's NoTf32Scope): forward, backward,
// prefill and recurrent steps. The CPU has no TF32, but the setting
// is a flag any device reads, so a feature map that records it each time the forms call it sees
// what their products would see on a GPU; after each call the run's setting is back.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Context.h>

#include <string>
#include <vector>

#include "attention/ops/causal_function.h"
#include "attention/ops/feature_map.h"
#include "attention/ops/recurrent_step.h"
#include "cuda/test_device.h"
#include "cuda_op_emulated.h"

namespace darkformer {
namespace {

constexpr int64_t kHeads = 2, kKvHeads = 1, kLength = 12, kDim = 4, kFeatures = 6;

// A positive map (log phi = x W^T - |x|^2 / 2) left generic, so the forms call it in the forward
// and again in the backward; each call records whether TF32 is allowed then.
FeatureMap RecordingMap(CausalOp op, std::vector<bool>& seen) {
  FeatureMap map;
  torch::manual_seed(3);
  map.params = {torch::randn({kFeatures, kDim})};
  map.op = op;
  map.num_features = kFeatures;
  map.log_features = [&seen](const torch::Tensor& x, const std::vector<torch::Tensor>& p, bool /*is_query*/) {
    seen.push_back(at::globalContext().allowTF32CuBLAS());
    return torch::matmul(x, p[0].to(x.scalar_type()).t()) - 0.5 * (x * x).sum(-1, /*keepdim=*/true);
  };
  return map;
}

TEST(Tf32ScopeTest, OperatorFormsRunTheirProductsWithTf32Off) {
  for (const auto op : {CausalOp::kChunkLoop, CausalOp::kChunkParallel, CausalOp::kCuda}) {
    const std::string form = CausalOpName(op);
    const testing::Tf32Scope run(true);
    std::vector<bool> seen;
    const auto map = RecordingMap(op, seen);
    torch::manual_seed(4);
    const auto x = torch::randn({1, kHeads, kLength, kDim}).requires_grad_();
    const auto y = torch::randn({1, kKvHeads, kLength, kDim}).requires_grad_();
    const auto v = torch::randn({1, kKvHeads, kLength, kDim}).requires_grad_();
    const auto out = FusedCausalLinearAttention(x, y, v, map, /*chunk_size=*/4);
    const size_t forward_calls = seen.size();
    EXPECT_TRUE(at::globalContext().allowTF32CuBLAS()) << form << ": the run's setting after the forward";
    out.sum().backward();
    EXPECT_TRUE(at::globalContext().allowTF32CuBLAS()) << form << ": the run's setting after the backward";
    ASSERT_GT(forward_calls, 0u) << form;
    ASSERT_GT(seen.size(), forward_calls) << form << ": the backward recomputes the features";
    for (size_t i = 0; i < seen.size(); ++i) {
      EXPECT_FALSE(seen[i]) << form << (i < forward_calls ? " forward" : " backward") << " call " << i;
    }
  }
}

TEST(Tf32ScopeTest, PrefillAndRecurrentStepsRunWithTf32Off) {
  const testing::Tf32Scope run(true);
  std::vector<bool> seen;
  const auto map = RecordingMap(CausalOp::kChunkLoop, seen);
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  const auto y = torch::randn({1, kKvHeads, kLength, kDim}), v = torch::randn({1, kKvHeads, kLength, kDim});
  auto state = LinearAttentionPrefillState(y, v, map, kHeads, /*chunk_size=*/4);
  LinearAttentionStep(state, torch::randn({1, kHeads, 1, kDim}), torch::randn({1, kKvHeads, 1, kDim}),
                      torch::randn({1, kKvHeads, 1, kDim}), map);
  EXPECT_TRUE(at::globalContext().allowTF32CuBLAS());
  ASSERT_FALSE(seen.empty());
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_FALSE(seen[i]) << "call " << i;
}

}  // namespace
}  // namespace darkformer
