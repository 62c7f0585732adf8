// The causal operator's forms (ops/feature_map.h) against the naive composite path (`op: naive`):
// outputs and gradients for every feature kernel, chunk sizes that do and do not divide L, L = 1,
// MHA / GQA / MQA layouts, shared and per-head M, and bf16 inputs; finite differences in fp64
// through the custom backwards; causality; the bytes autograd saves; and the recurrent step. Every
// test runs for each form, chosen by the kernels' `op` option: `auto` (on this CPU the raw fp32
// kernel of raw_cpu_kernel.h where it applies, the chunk loop elsewhere), `chunk_loop` and
// `chunk_parallel` (the LibTorch-ops forms CUDA can run), and `cuda` (the CUDA operator's scan,
// emulated on the host: cuda_op.h; fp32 only).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "attention/kernel_traits.h"
#include "attention/derf_test_state.h"
#include "attention/darkformer_kernel.h"
#include "attention/ops/fast_exp2.h"
#include "attention/fused_causal_attention.h"
#include "attention/ops/raw_cpu_kernel.h"
#include "attention/kernel_registry.h"
#include "attention/lfk_kernel.h"
#include "attention/log_feature_kernel.h"
#include "cuda_op_emulated.h"

namespace darkformer {
namespace {

// darkformer-shared: one M for all heads; darkformer-rank2: M is 2 x d (a low-rank Sigma);
// darkformer-queries: M per head on the queries only (per-head parameters, keys per KV head);
// darkformer-softmax: importance-weighted draws (per-head parameters, keys per query head, no
// positive form).
std::vector<std::string> FeatureKernels() {
  auto names = KernelNames(KernelFamily::kPositive);
  names.insert(names.end(), {"darkformer-shared", "darkformer-rank2", "darkformer-queries", "darkformer-softmax"});
  return names;
}
const std::vector<std::string> kFeatureKernels = FeatureKernels();

AttentionKernel Make(const std::string& variant, int64_t heads, int64_t d, int64_t m, int64_t chunk, const std::string& op) {
  KernelShape shape;
  shape.num_heads = heads;
  shape.head_dim = d;
  const std::string name = variant.substr(0, variant.find('-'));
  const std::string extra = variant == "darkformer-shared" ? ", share_across_heads: true"
                            : variant == "darkformer-rank2" ? ", rank: 2"
                            : variant == "darkformer-queries" ? ", apply_to: queries"
                            : variant == "darkformer-softmax" ? ", target: softmax"
                                                            : "";
  const std::string yaml = "{num_features: " + std::to_string(m) + ", chunk_size: " + std::to_string(chunk) +
                           ", op: " + op + (name == "gerf" ? ", a: -0.2" : "") + extra + "}";
  auto kernel = MakeAttentionKernel(name, shape, ConfigReader(YAML::Load(yaml), "attention." + name));
  if (name == "darkformer") {
    // A non-trivial, per-head M: the gradient path through M x must be exercised.
    torch::NoGradGuard no_grad;
    auto& m_param = kernel->named_parameters()["M"];
    torch::manual_seed(11);
    m_param.copy_(torch::eye(m_param.size(1), d).unsqueeze(0) + 0.3 * torch::randn_like(m_param));
  }
  if (name == "saderf") {
    // Calibrated-looking state: psi != 1 (queries and keys transformed differently), A* < 0.
    torch::NoGradGuard no_grad;
    torch::manual_seed(12);
    auto buffers = kernel->named_buffers();
    buffers["psi"].copy_((0.3 * torch::randn_like(buffers["psi"])).exp());
    buffers["a"].fill_(-0.15);
  }
  PerturbDerf(*kernel, 0.3, 12);  // aderf, sderf: a random valid dense state
  return kernel;
}

double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max() /
          b.to(torch::kFloat64).abs().max().clamp_min(1e-30))
      .item<double>();
}

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

// The parameter: the kernels' `op`.
class FusedCausalAttentionTest : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string& op() const { return GetParam(); }
};

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

TEST_P(FusedCausalAttentionTest, LaterKeysNeverTouchEarlierOutputs) {
  torch::manual_seed(7);
  const int64_t heads = 4, kv = 1, length = 50, t = 20, d = 8;
  const auto q = torch::randn({1, heads, length, d}), k = torch::randn({1, kv, length, d}),
             v = torch::randn({1, kv, length, d});
  auto k2 = k.clone(), v2 = v.clone();
  k2.narrow(2, t + 1, length - t - 1).mul_(200.0);  // keys after t with huge norms
  v2.narrow(2, t + 1, length - t - 1).normal_();
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (const auto& name : kFeatureKernels) {
    auto kernel = Make(name, heads, d, 32, 16, op());
    const auto a = kernel->forward(q, k, v, call), b = kernel->forward(q, k2, v2, call);
    EXPECT_EQ((a.narrow(2, 0, t + 1) - b.narrow(2, 0, t + 1)).abs().max().item<double>(), 0.0) << name;
    EXPECT_TRUE(torch::isfinite(b).all().item<bool>()) << name;
  }
}

// Prefix invariance: new tokens after t (queries, keys with huge norms, values) leave every output
// at positions <= t bit-identical, in every chunk (t inside a chunk, so later keys share it).
TEST_P(FusedCausalAttentionTest, NewTokensAfterTLeaveEarlierOutputsBitIdentical) {
  torch::manual_seed(8);
  const int64_t heads = 4, kv = 2, length = 45, t = 21, d = 8;
  const auto q = torch::randn({2, heads, length, d}), k = torch::randn({2, kv, length, d}),
             v = torch::randn({2, kv, length, d});
  auto q2 = q.clone(), k2 = k.clone(), v2 = v.clone();
  q2.narrow(2, t + 1, length - t - 1).normal_().mul_(30.0);
  k2.narrow(2, t + 1, length - t - 1).normal_().mul_(30.0);
  v2.narrow(2, t + 1, length - t - 1).normal_();
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (const auto& name : kFeatureKernels) {
    auto kernel = Make(name, heads, d, 32, 16, op());
    const auto a = kernel->forward(q, k, v, call), b = kernel->forward(q2, k2, v2, call);
    EXPECT_EQ((a.narrow(2, 0, t + 1) - b.narrow(2, 0, t + 1)).abs().max().item<double>(), 0.0) << name;
    EXPECT_GT((a.narrow(2, t + 1, 1) - b.narrow(2, t + 1, 1)).abs().max().item<double>(), 1e-3) << name;
    EXPECT_TRUE(torch::isfinite(b).all().item<bool>()) << name;
  }
}

// Autograd keeps O(L D) bytes (x, y, v, output, normaliser), never O(L m) features.
TEST_P(FusedCausalAttentionTest, SavedTensorsGrowWithLTimesDNotLTimesM) {
  const int64_t heads = 2, d = 16;
  auto saved = [&](int64_t length, int64_t m) {
    torch::manual_seed(1);
    auto kernel = Make("darkformer", heads, d, m, 64, op());
    const auto q = torch::randn({1, heads, length, d}, torch::requires_grad()),
               k = torch::randn({1, heads, length, d}, torch::requires_grad()),
               v = torch::randn({1, heads, length, d}, torch::requires_grad());
    AttentionCall call;
    const auto out = FusedCausalLinearAttention(q, k, v, std::dynamic_pointer_cast<LogFeatureKernel>(kernel.ptr())->MakeFeatureMap(), 64);
    return FusedCausalSavedBytes(out);
  };
  const int64_t length = 2048;
  const int64_t small_m = saved(length, 16), large_m = saved(length, 1024), double_l = saved(2 * length, 1024);
  const int64_t one_feature_tensor = int64_t{heads} * length * 1024 * 4;
  std::cout << "[saved bytes] L=2048 m=16: " << small_m << ", m=1024: " << large_m << ", L=4096 m=1024: " << double_l
            << " (one L x m feature tensor: " << one_feature_tensor << ")\n";
  EXPECT_GT(small_m, 0);
  // m only adds the draw W (m x d) and nothing per position.
  EXPECT_EQ(large_m - small_m, (1024 - 16) * d * 4);
  EXPECT_LT(large_m, one_feature_tensor / 4);
  const double per_position = static_cast<double>(double_l - large_m) / length;
  EXPECT_NEAR(per_position, static_cast<double>(large_m - 1024 * d * 4 - heads * d * d * 4) / length, 1.0);
}

// Positive features (performer here; darkformer and lfk take the same path) through the kernel's
// own forward: on the raw CPU kernel the backward also reads checkpoints of the state and its
// per-feature reference, V + 1 = d + 2 floats per position and key row whatever m
// (raw_cpu_kernel.h). Per position: x, y, v and the output (d floats per head each; op: cuda
// recomputes the output instead), the normaliser (per head) and the checkpoints; the draw W is the
// only term that grows with m.
TEST_P(FusedCausalAttentionTest, SavedTensorsOfPositiveFeaturesStayOLTimesD) {
  const int64_t heads = 2, d = 16, chunk = 64;
  auto saved = [&](int64_t length, int64_t m) {
    torch::manual_seed(1);
    auto kernel = Make("performer", heads, d, m, chunk, op());
    const auto q = torch::randn({1, heads, length, d}, torch::requires_grad()),
               k = torch::randn({1, heads, length, d}, torch::requires_grad()),
               v = torch::randn({1, heads, length, d}, torch::requires_grad());
    AttentionCall call;
    return FusedCausalSavedBytes(kernel->forward(q, k, v, call));
  };
  const int64_t length = 2048;
  for (const int64_t m : {16, 256, 1024}) {
    const int64_t at_l = saved(length, m), at_2l = saved(2 * length, m);
    const double per_position = static_cast<double>(at_2l - at_l) / length;
    const double budget = 4.0 * (heads * (4 * d + 1) + heads * (d + 2));
    std::cout << "[saved bytes, positive features] m=" << m << ": " << per_position << " per position (budget "
              << budget << ", an L x m feature tensor: " << 4 * heads * m << ")\n";
    const int64_t per_head = op() == "cuda" ? 3 : 4;  // x, y, v and (but for op: cuda) the output at least
    EXPECT_GT(at_l, per_head * heads * length * 4 * d) << m;
    EXPECT_LE(per_position, budget) << m;
  }
}

TEST_P(FusedCausalAttentionTest, RecurrentStepsEqualTheParallelForm) {
  torch::manual_seed(9);
  const int64_t heads = 4, kv = 2, length = 23, prefill = 9, d = 8;
  const auto x = torch::randn({1, heads, length, d}), y = torch::randn({1, kv, length, d}) * 2,
             v = torch::randn({1, kv, length, d});
  for (const auto& name : kFeatureKernels) {
    auto kernel = Make(name, heads, d, 16, 4, op());
    const auto map = std::dynamic_pointer_cast<LogFeatureKernel>(kernel.ptr())->MakeFeatureMap();
    torch::NoGradGuard no_grad;
    const auto full = FusedCausalLinearAttention(x, y, v, map, 4);
    // From scratch, one token at a time.
    LinearAttentionState state;
    for (int64_t t = 0; t < length; ++t) {
      const auto out = LinearAttentionStep(state, x.narrow(2, t, 1), y.narrow(2, t, 1), v.narrow(2, t, 1), map);
      EXPECT_LE(RelativeError(out, full.narrow(2, t, 1)), 1e-5) << name << " t=" << t;
    }
    // Prefill with the chunked path, then steps.
    auto prefilled = LinearAttentionPrefillState(y.narrow(2, 0, prefill), v.narrow(2, 0, prefill), map, heads, 4);
    EXPECT_EQ(prefilled.tokens, prefill);
    for (int64_t t = prefill; t < length; ++t) {
      const auto out = LinearAttentionStep(prefilled, x.narrow(2, t, 1), y.narrow(2, t, 1), v.narrow(2, t, 1), map);
      EXPECT_LE(RelativeError(out, full.narrow(2, t, 1)), 1e-5) << name << " t=" << t;
    }
  }
}

}  // namespace
}  // namespace darkformer
