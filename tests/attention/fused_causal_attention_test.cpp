// The causal operator's forms (ops/feature_map.h) against the naive composite path (`op: naive`):
// outputs and gradients for every feature kernel, chunk sizes that do and do not divide L, L = 1,
// MHA / GQA / MQA layouts, shared and per-head M, and bf16 inputs; finite differences in fp64
// through the custom backwards (causality, saved bytes and the recurrent step:
// fused_causal_structure_test.cpp). Every test runs for each form, chosen by the kernels' `op` option: `auto` (on this CPU the raw fp32
// kernel of raw_cpu_kernel.h where it applies, the chunk loop elsewhere), `chunk_loop` and
// `chunk_parallel` (the LibTorch-ops forms CUDA can run), and `cuda` (the CUDA operator's scan,
// emulated on the host: cuda_op.h; fp32 only).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "attention/darkformer_kernel.h"
#include "attention/fused_causal_attention.h"
#include "attention/fused_causal_test_util.h"
#include "attention/lfk_kernel.h"
#include "attention/log_feature_kernel.h"
#include "attention/ops/fast_exp2.h"
#include "attention/ops/raw_cpu_kernel.h"
#include "cuda_op_emulated.h"

namespace darkformer {
namespace {

using namespace fused_causal_test;

struct Result {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;  // q, k, v, then the kernel's trainable parameters
};

Result RunKernel(AttentionKernel& kernel, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
           const torch::Tensor& weights) {
  auto qq = q.detach().requires_grad_(true), kk = k.detach().requires_grad_(true), vv = v.detach().requires_grad_(true);
  for (auto& p : kernel->parameters()) p.mutable_grad() = torch::Tensor();
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const auto out = kernel->forward(qq, kk, vv, call);
  (out.to(torch::kFloat32) * weights).sum().backward();
  Result r{out.detach(), {qq.grad(), kk.grad(), vv.grad()}};
  for (auto& p : kernel->parameters()) r.grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return r;
}

// Fused and naive outputs and gradients (q, k, v, the kernel's parameters) for one configuration.
void ExpectFusedEqualsNaive(const std::string& op, const std::string& name, int64_t batch, int64_t heads,
                            int64_t kv_heads, int64_t length, int64_t chunk) {
  torch::manual_seed(length * 100 + chunk);
  const int64_t d = 8, m = 16;
  const auto q = torch::randn({batch, heads, length, d});
  const auto k = torch::randn({batch, kv_heads, length, d});
  const auto v = torch::randn({batch, kv_heads, length, d});
  const auto weights = torch::randn({batch, heads, length, d});
  auto fused = Make(name, heads, d, m, chunk, op);
  auto naive = Make(name, heads, d, m, chunk, "naive");
  const auto a = RunKernel(fused, q, k, v, weights);
  const auto b = RunKernel(naive, q, k, v, weights);
 const std::string where = op + " " + name + " B=" + std::to_string(batch) + " H=" + std::to_string(heads) +
                            " K=" + std::to_string(kv_heads) + " L=" + std::to_string(length) +
                            " chunk=" + std::to_string(chunk) + " threads=" + std::to_string(torch::get_num_threads());
  EXPECT_LE(RelativeError(a.out, b.out), 1e-5) << where;
  ASSERT_EQ(a.grads.size(), b.grads.size()) << where;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_EQ(a.grads[i].defined(), b.grads[i].defined()) << where << " grad " << i;
    if (!a.grads[i].defined()) continue;
    if (b.grads[i].abs().max().item<double>() < 1e-5) {
      // A zero gradient (at L = 1, out = v_0: q, k and the kernel's parameters do not
      // matter): both must be zero up to fp32 rounding; a ratio of roundoffs means nothing.
      EXPECT_LE(a.grads[i].abs().max().item<double>(), 1e-5) << where << " grad " << i;
    } else {
      EXPECT_LE(RelativeError(a.grads[i], b.grads[i]), 1e-4) << where << " grad " << i;
    }
  }
}

// cuda: the CUDA operator's scan, its device arithmetic emulated on the host (cuda_op_emulated.h).
INSTANTIATE_TEST_SUITE_P(Ops, FusedCausalAttentionTest, ::testing::Values("auto", "chunk_loop", "chunk_parallel", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// The raw kernel runs for fp32 positive features (performer, darkformer, lfk) where the exp2
// loops are vectorised, and not when switched off, for fp64 or for other feature maps (gerf).
TEST_P(FusedCausalAttentionTest, TheRawKernelRunsWhereItApplies) {
  torch::manual_seed(2);
  const auto q = torch::randn({1, 2, 10, 8}), k = torch::randn({1, 2, 10, 8}), v = torch::randn({1, 2, 10, 8});
  const auto weights = torch::randn({1, 2, 10, 8});
  auto runs = [&](const std::string& name, torch::Dtype dtype) {
    auto kernel = Make(name, 2, 8, 16, 4, op());
    kernel->to(dtype);
    const int64_t before = PositiveRowKernelRuns();
    RunKernel(kernel, q.to(dtype), k.to(dtype), v.to(dtype), weights.to(dtype));
    return PositiveRowKernelRuns() - before;
  };
  const bool applies = op() == "auto" && Exp2LoopsVectorised();
  for (const auto& name : {"performer", "darkformer", "lfk"}) {
    EXPECT_EQ(runs(name, torch::kFloat32), applies ? 4 : 0) << name;  // 2 rows, forward and backward
    if (op() == "cuda") {  // fp32 only: fp64 inputs are refused, not computed in another precision
      EXPECT_THROW(runs(name, torch::kFloat64), std::exception) << name;
      continue;
    }
    EXPECT_EQ(runs(name, torch::kFloat64), 0) << name;
  }
  EXPECT_EQ(runs("gerf", torch::kFloat32), 0);
}

TEST_P(FusedCausalAttentionTest, EqualsNaiveForEveryKernelChunkAndHeadLayout) {
  struct Layout {
    int64_t heads, kv_heads;
  };
  for (const auto& name : kFeatureKernels) {
    for (const Layout layout : {Layout{2, 2}, Layout{4, 2}, Layout{4, 1}}) {
      for (const int64_t length : {1, 32}) {
        for (const int64_t chunk : {5, 16, 64}) {  // 16 divides L = 32, 5 does not, 64 exceeds it
          ExpectFusedEqualsNaive(op(), name, 2, layout.heads, layout.kv_heads, length, chunk);
        }
      }
    }
  }
}

// The operator splits key rows (KV heads; query heads for darkformer's per-head M) into one block
// per thread: blocks of unequal size, one row per block and a single block must all agree; with
// fewer rows than threads it also splits a row's query heads into parts that share its key side
// (each part adds its share of dk, dv and the parameters' gradients).
TEST_P(FusedCausalAttentionTest, EqualsNaiveWhateverTheSplitIntoThreads) {
  const int64_t saved_threads = torch::get_num_threads();
  for (const int64_t threads : {1, 2, 3}) {
    torch::set_num_threads(threads);
    for (const auto& name : kFeatureKernels) {
      ExpectFusedEqualsNaive(op(), name, 1, 6, 3, 20, 8);  // 3 KV heads (darkformer: 6 query-head rows)
      ExpectFusedEqualsNaive(op(), name, 1, 4, 1, 20, 8);  // MQA: one KV head, 2 parts at 2 or 3 threads
      ExpectFusedEqualsNaive(op(), name, 1, 6, 1, 20, 8);  // MQA: 3 parts of 2 query heads at 3 threads
      ExpectFusedEqualsNaive(op(), name, 1, 8, 2, 20, 8);  // GQA: 2 rows, 2 parts each at 3 threads
      ExpectFusedEqualsNaive(op(), name, 2, 4, 1, 20, 8);  // 2 batch rows, 2 parts each at 3 threads
    }
  }
  torch::set_num_threads(saved_threads);
}

// The operator folds the batch into the heads. Per-head parameters then repeat per sequence and
// their gradients sum over the sequences: darkformer's own feature map (the generic path, M per
// query head inside log phi) called directly, against the naive path, for B = 1..3 and every split.
TEST_P(FusedCausalAttentionTest, PerHeadParametersThroughTheGenericPathAcrossBatches) {
  const int64_t saved_threads = torch::get_num_threads();
  const int64_t heads = 4, length = 19, d = 8, m = 16, chunk = 8;
  for (const int64_t threads : {1, 2, 3}) {
    torch::set_num_threads(threads);
    for (const int64_t batch : {1, 2, 3}) {
      for (const int64_t kv : {1, 2}) {
        torch::manual_seed(batch * 10 + kv);
        const auto q = torch::randn({batch, heads, length, d}), k = torch::randn({batch, kv, length, d}),
                   v = torch::randn({batch, kv, length, d}), weights = torch::randn({batch, heads, length, d});
        auto generic = Make("darkformer", heads, d, m, chunk, op());
        auto naive = Make("darkformer", heads, d, m, chunk, "naive");
        const double root = std::pow(static_cast<double>(d), -0.25);
        auto qq = q.clone().requires_grad_(), kk = k.clone().requires_grad_(), vv = v.clone().requires_grad_();
        const auto map = std::dynamic_pointer_cast<LogFeatureKernel>(generic.ptr())->MakeFeatureMap();
        ASSERT_TRUE(map.params_per_head.at(0));
        const auto out = FusedCausalLinearAttention(qq * root, kk * root, vv, map, chunk);
        (out * weights).sum().backward();
        const auto b = RunKernel(naive, q, k, v, weights);
        const std::string where = "B=" + std::to_string(batch) + " K=" + std::to_string(kv) +
                                  " threads=" + std::to_string(threads);
        EXPECT_LE(RelativeError(out.detach(), b.out), 1e-5) << where;
        const std::vector<torch::Tensor> grads = {qq.grad(), kk.grad(), vv.grad(), generic->named_parameters()["M"].grad()};
        for (size_t i = 0; i < grads.size(); ++i) {
          ASSERT_TRUE(grads[i].defined()) << where << " grad " << i;
          EXPECT_LE(RelativeError(grads[i], b.grads[i]), 1e-4) << where << " grad " << i;
        }
      }
    }
  }
  torch::set_num_threads(saved_threads);
}

TEST_P(FusedCausalAttentionTest, Bf16InputsKeepFp32FeaturesAndMatchNaive) {
  torch::manual_seed(3);
  const int64_t heads = 4, kv = 1, length = 40, d = 16;
  const auto q = torch::randn({1, heads, length, d}).to(torch::kBFloat16);
  const auto k = torch::randn({1, kv, length, d}).to(torch::kBFloat16);
  const auto v = torch::randn({1, kv, length, d}).to(torch::kBFloat16);
  const auto weights = torch::randn({1, heads, length, d});
  for (const auto& name : kFeatureKernels) {
    auto fused = Make(name, heads, d, 32, 16, op());
    auto naive = Make(name, heads, d, 32, 16, "naive");
    const auto a = RunKernel(fused, q, k, v, weights);
    const auto b = RunKernel(naive, q, k, v, weights);
    EXPECT_EQ(a.out.scalar_type(), torch::kBFloat16);
    // Both sum in fp32 and round once to bf16 (8 bits of mantissa): at most one bf16 ulp apart.
    EXPECT_LE(RelativeError(a.out, b.out), 1.0 / 128) << name;
    for (size_t i = 0; i < 3; ++i) EXPECT_LE(RelativeError(a.grads[i], b.grads[i]), 1.0 / 64) << name << " grad " << i;
  }
}

// Central differences in fp64 through the custom backward (inputs and M / W).
TEST_P(FusedCausalAttentionTest, FiniteDifferenceGradientsInFp64) {
  if (op() == "cuda") GTEST_SKIP() << "op: cuda computes in fp32 and refuses fp64 (TheRawKernelRunsWhereItApplies); its gradients are checked against the naive form's";
  for (const auto& name : kFeatureKernels) {
    torch::manual_seed(5);
    const int64_t heads = 2, kv = 1, length = 7, d = 3, m = 5, chunk = 3;
    auto kernel = Make(name, heads, d, m, chunk, op());
    kernel->to(torch::kFloat64);
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    auto q = torch::randn({1, heads, length, d}, f64), k = torch::randn({1, kv, length, d}, f64),
         v = torch::randn({1, kv, length, d}, f64);
    const auto weights = torch::randn({1, heads, length, d}, f64);
    AttentionCall call;
    auto loss = [&] { return (kernel->forward(q, k, v, call) * weights).sum(); };
    std::vector<torch::Tensor> inputs = {q, k, v};
    for (auto& p : kernel->parameters()) inputs.push_back(p);
    for (auto& t : inputs) t.requires_grad_(true);
    loss().backward();
    double worst = 0;
    for (auto& t : inputs) {
      const auto analytic = t.grad().clone();
      auto flat = t.data().view(-1);
      for (int64_t i = 0; i < flat.numel(); ++i) {
        const double h = 1e-6, x0 = flat[i].item<double>();
        double lp, lm;
        {
          torch::NoGradGuard no_grad;
          flat[i] = x0 + h;
          lp = loss().item<double>();
          flat[i] = x0 - h;
          lm = loss().item<double>();
          flat[i] = x0;
        }
        const double numeric = (lp - lm) / (2 * h);
        worst = std::max(worst, std::abs(numeric - analytic.view(-1)[i].item<double>()) / std::max(1.0, std::abs(numeric)));
      }
    }
    std::cout << "[fused fd] " << op() << " " << name << ": worst relative gradient error " << worst << "\n";
    EXPECT_LE(worst, 1e-6) << name;
  }
}

}  // namespace
}  // namespace darkformer
