// Positive-feature attention at scales where the scalar stabiliser's normaliser underflows
// (issue 38; ../docs/kernels.md, "The normaliser at any scale"): |x| = |y| up to 100, darkformer M
// and ADERF P with condition number 10^3, and queries whose large features disagree with the
// keys' (k_t = -q_{t-1}, or every key opposite every query). For every positive kernel and every
// form (naive, raw CPU kernel via auto, chunk loop, chunk-parallel, the CUDA operator's scan
// emulated on the host, prefill + recurrent steps), in
// fp32 and with bf16 inputs: outputs and every gradient are finite and match an fp64 log-space
// reference, out_t = sum_j softmax_j(logsumexp_i(a_ti + l_ji)) v_j, to
//   relative 1e-4 (outputs) and 1e-3 (gradients) up to |x| = 30, and beyond that
//   max(1e-4, 4 A 2^-24) and 10x that, A = max |log phi| of the case: fp32 rounds the exponent
//   arguments to A 2^-24, which no stabiliser can undo (about |x|^2 2^-24 for Performer; see
//   Tolerance() for ADERF's ill-conditioned P, and Reference for gradients that vanish in fp64).
// bf16 inputs return bf16 outputs and input gradients: their tolerance is at least 2^-8.
// Before the per-feature stabiliser (the scalar one with a floored normaliser) this test failed
// in every fused form at |x| >= 30 (223 failed checks): outputs up to 100 % off, NaN q/k gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>

#include "attention/derf_test_state.h"
#include "attention/kernel_registry.h"
#include "attention/log_feature_kernel.h"
#include "cuda_op_emulated.h"
#include "rounding_bounds.h"

namespace darkformer {
namespace {

const std::vector<std::string> kPositiveKernels = {"performer", "darkformer", "lfk",  "gerf",
                                                   "saderf",    "aderf",      "sderf"};
// cuda: the CUDA operator's own arithmetic, emulated on the host (cuda_op_emulated.h).
const std::vector<std::string> kForms = {"naive", "auto", "chunk_loop", "chunk_parallel", "cuda"};
constexpr int64_t kHeads = 2, kKvHeads = 1, kLength = 40, kDim = 8, kFeatures = 16, kChunk = 16;
constexpr double kCondition = 1e3;

AttentionKernel Make(const std::string& name, const std::string& op) {
  KernelShape shape;
  shape.num_heads = kHeads;
  shape.head_dim = kDim;
  const std::string yaml = "{num_features: " + std::to_string(kFeatures) + ", chunk_size: " + std::to_string(kChunk) +
                           ", op: " + op + (name == "gerf" ? ", a: -0.2" : "") + "}";
  auto kernel = MakeAttentionKernel(name, shape, ConfigReader(YAML::Load(yaml), "attention." + name));
  torch::NoGradGuard no_grad;
  if (name == "darkformer") {
    // Per head M = U diag(sigma) V^T, sigma from 1 down to 10^-3: condition 10^3, |M x| <= |x|.
    auto m_param = kernel->named_parameters()["M"];
    auto g = at::make_generator<at::CPUGeneratorImpl>(21);
    const auto sigma = torch::logspace(0, -std::log10(kCondition), kDim, 10.0, torch::kFloat64);
    for (int64_t h = 0; h < m_param.size(0); ++h) {
      const auto u = std::get<0>(torch::linalg_qr(torch::randn({kDim, kDim}, g, torch::kFloat64)));
      const auto v = std::get<0>(torch::linalg_qr(torch::randn({kDim, kDim}, g, torch::kFloat64)));
      m_param[h].copy_(torch::matmul(u * sigma, v.t()));
    }
  }
  if (name == "saderf") {
    auto buffers = kernel->named_buffers();
    torch::manual_seed(12);
    buffers["psi"].copy_((0.3 * torch::randn_like(buffers["psi"])).exp());
    buffers["a"].fill_(-0.15);
  }
  PerturbDerf(*kernel, 0.3, 12, kCondition);  // aderf: P with condition 10^3; sderf: a rotation
  return kernel;
}

// q_t = s u_t; keys point away from the queries: k_t = -s u_{t-1} ("anti"), or every query near u
// and every key near -u ("opposed"). v ~ N(0, 1). Norms are of x = q / d^(1/4) (the kernel's input).
struct Inputs {
  torch::Tensor q, k, v, weights;
};
Inputs MakeInputs(double norm, const std::string& pattern) {
  torch::manual_seed(static_cast<uint64_t>(norm) * 7 + pattern.size());
  const double s = norm * std::pow(static_cast<double>(kDim), 0.25);
  auto unit = [](const torch::Tensor& t) { return t / t.norm(2, -1, true); };
  Inputs in;
  if (pattern == "anti") {
    const auto u = unit(torch::randn({1, kHeads, kLength + 1, kDim}));
    in.q = s * u.narrow(2, 1, kLength);
    in.k = -s * u.narrow(1, 0, kKvHeads).narrow(2, 0, kLength);
  } else {
    const auto u = unit(torch::randn({kDim}));
    in.q = s * unit(u + 0.1 * torch::randn({1, kHeads, kLength, kDim}));
    in.k = -s * unit(u + 0.1 * torch::randn({1, kKvHeads, kLength, kDim}));
  }
  in.v = torch::randn({1, kKvHeads, kLength, kDim});
  // bf16-representable: with bf16 outputs the upstream gradient arrives in bf16 unrounded.
  in.weights = torch::randn({1, kHeads, kLength, kDim}).to(torch::kBFloat16).to(torch::kFloat32);
  return in;
}

struct Result {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;  // q, k, v, then the kernel's trainable parameters
};

double Scale() { return 1.0 / std::sqrt(static_cast<double>(kDim)); }

Result RunKernel(AttentionKernel& kernel, const Inputs& in, torch::ScalarType dtype) {
  auto leaf = [dtype](const torch::Tensor& t) { return t.detach().to(dtype).clone().requires_grad_(); };
  auto q = leaf(in.q), k = leaf(in.k), v = leaf(in.v);
  for (auto& p : kernel->parameters()) p.mutable_grad() = torch::Tensor();
  AttentionCall call;
  call.scale = Scale();
  const auto out = kernel->forward(q, k, v, call);
  (out.to(torch::kFloat64) * in.weights.to(torch::kFloat64)).sum().backward();
  Result r{out.detach(), {q.grad(), k.grad(), v.grad()}};
  for (auto& p : kernel->parameters()) r.grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return r;
}

// The fp64 log-space reference from the kernel's own log-features (its copy in fp64), and A.
// gradient_floor: where attention is one-hot to fp64's precision, q, k and the parameters have
// gradients far below what fp32 can resolve (the reference's are ~1e-25, ours fp32 round-off), and
// a relative error means nothing. Errors are then measured against fp32's reach on this case:
// A 2^-24 (the arguments' rounding) times max|w| max|v| max(|q|, |k|), the size of a gradient
// through scores that move by A 2^-24.
struct Reference {
  Result result;
  double max_log_feature, gradient_floor;
  double map_error;  // max |a32 - a64| + max |l32 - l64|: the map's own fp32 rounding of the exponents
};
using KernelFactory = std::function<AttentionKernel(const std::string& op)>;

Reference RunReference(const KernelFactory& make, const Inputs& in, torch::ScalarType input_dtype) {
  auto kernel = make("naive");
  kernel->to(torch::kFloat64);
  auto* features = dynamic_cast<LogFeatureKernel*>(kernel.ptr().get());
  // The reference sees the inputs the kernel saw (bf16-rounded where they were).
  auto leaf = [input_dtype](const torch::Tensor& t) {
    return t.detach().to(input_dtype).to(torch::kFloat64).clone().requires_grad_();
  };
  auto q = leaf(in.q), k = leaf(in.k), v = leaf(in.v);
  const double root = std::sqrt(Scale());
  const auto a = features->LogFeatures(q * root, /*is_query=*/true);
  const auto l = features->LogFeatures(k.repeat_interleave(kHeads / kKvHeads, 1) * root, /*is_query=*/false);
  const auto scores = (a.unsqueeze(3) + l.unsqueeze(2)).logsumexp(-1);  // B H L L
  const auto later = torch::ones({kLength, kLength}, torch::kBool).triu(1);
  const auto p = torch::softmax(scores.masked_fill(later, -INFINITY), -1);
  const auto out = torch::matmul(p, v.repeat_interleave(kHeads / kKvHeads, 1));
  (out * in.weights.to(torch::kFloat64)).sum().backward();
  Reference ref{{out.detach(), {q.grad(), k.grad(), v.grad()}}, 0.0, 0.0};
  for (auto& param : kernel->parameters()) {
    ref.result.grads.push_back(param.grad().defined() ? param.grad().clone() : torch::Tensor());
  }
  ref.max_log_feature = std::max(a.abs().max().item<double>(), l.abs().max().item<double>());
  {
    torch::NoGradGuard no_grad;
    auto fp32 = make("naive");  // the same state in fp32
    auto* features32 = dynamic_cast<LogFeatureKernel*>(fp32.ptr().get());
    auto rounded = [input_dtype](const torch::Tensor& t) { return t.detach().to(input_dtype).to(torch::kFloat32); };
    const auto a32 = features32->LogFeatures(rounded(in.q) * root, /*is_query=*/true);
    const auto l32 = features32->LogFeatures(rounded(in.k).repeat_interleave(kHeads / kKvHeads, 1) * root, false);
    ref.map_error = (a32 - a.detach()).abs().max().item<double>() + (l32 - l.detach()).abs().max().item<double>();
  }
  ref.gradient_floor = ref.max_log_feature * std::ldexp(1.0, -24) * in.weights.abs().max().item<double>() *
                       in.v.abs().max().item<double>() *
                       std::max(in.q.abs().max().item<double>(), in.k.abs().max().item<double>());
  return ref;
}

Reference RunReference(const std::string& name, const Inputs& in, torch::ScalarType input_dtype) {
  return RunReference([&](const std::string& op) { return Make(name, op); }, in, input_dtype);
}

// max |a - b| / max(max |b|, floor).
double RelativeError(const torch::Tensor& a, const torch::Tensor& b, double floor = 0.0) {
  const auto b64 = b.to(torch::kFloat64);
  return ((a.to(torch::kFloat64) - b64).abs().max() / b64.abs().max().clamp_min(std::max(floor, 1e-300))).item<double>();
}

bool AllFinite(const torch::Tensor& t) { return torch::isfinite(t).all().item<bool>(); }

// The fp32 output's bound relative to max |reference| (rounding_bounds.h). Every weight
// sum_i exp(a_ti + l_ji - s_t) is positive. The map's own fp32 rounding of the exponents is taken
// as it is on these inputs, twice over (the operator evaluates the same sums in its own order or
// base); the stabiliser's arguments reach 4 A (A = max |log phi|: fp32 rounds them to A 2^-24, which
// no stabiliser can undo) through at most N + 2 exps and products; each term is summed over the
// m features and L positions.
double Tolerance(const Reference& ref, const Inputs& in) {
  const int64_t chunks = (kLength + kChunk - 1) / kChunk;
  const double weight_error = std::expm1(2 * ref.map_error) + testing::ScaleChainError(chunks + 2, 4 * ref.max_log_feature);
  const double bound = testing::PositiveAverageBound(weight_error, kFeatures + kLength + 3, in.v.abs().max().item<double>());
  return bound / ref.result.out.abs().max().item<double>();
}

void ExpectMatches(const Result& got, const Reference& ref, const Inputs& in, torch::ScalarType dtype,
                   const std::string& where) {
  const double out_tol = Tolerance(ref, in);
  const double grad_tol = 10 * out_tol;
  if (std::getenv("DARKFORMER_PRINT_ERRORS")) std::cout << where << " output: " << RelativeError(got.out, ref.result.out) << " of " << out_tol << "\n";
  const double storage = dtype == torch::kBFloat16 ? std::ldexp(1.0, -8) : 0.0;  // bf16 outputs and input grads
  ASSERT_TRUE(AllFinite(got.out)) << where << ": non-finite output";
  EXPECT_LE(RelativeError(got.out, ref.result.out), std::max(out_tol, storage)) << where << " output";
  ASSERT_EQ(got.grads.size(), ref.result.grads.size()) << where;
  for (size_t i = 0; i < got.grads.size(); ++i) {
    ASSERT_EQ(got.grads[i].defined(), ref.result.grads[i].defined()) << where << " grad " << i;
    if (!got.grads[i].defined()) continue;
    ASSERT_TRUE(AllFinite(got.grads[i])) << where << ": non-finite gradient " << i;
    const double tol = i < 3 ? std::max(grad_tol, storage) : grad_tol;
    const double error = RelativeError(got.grads[i], ref.result.grads[i], ref.gradient_floor);
    if (std::getenv("DARKFORMER_PRINT_ERRORS")) std::cout << where << " grad " << i << ": " << error << " of " << tol << "\n";
    EXPECT_LE(error, tol) << where << " grad " << i << " (A = " << ref.max_log_feature << ")";
  }
}

class ExtremeScaleTest : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Kernels, ExtremeScaleTest, ::testing::ValuesIn(kPositiveKernels),
                         [](const auto& info) { return info.param; });

TEST_P(ExtremeScaleTest, EveryFormFiniteAndEqualToLogSpaceReference) {
  const std::string& name = GetParam();
  for (const std::string pattern : {"anti", "opposed"}) {
    for (const double norm : {10.0, 30.0, 60.0, 100.0}) {
      const auto in = MakeInputs(norm, pattern);
      for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
        const auto ref = RunReference(name, in, dtype);
        for (const auto& form : kForms) {
          auto kernel = Make(name, form);
          const std::string where = name + " " + form + " " + pattern + " |x|=" + std::to_string(int(norm)) +
                                    (dtype == torch::kBFloat16 ? " bf16" : " fp32");
          ExpectMatches(RunKernel(kernel, in, dtype), ref, in, dtype, where);
        }
      }
    }
  }
}

// Prefill of the first half, then one recurrent step per token: the step outputs match the
// reference rows (the per-feature state's normaliser is >= 1 too), the prefill's state from the
// LibTorch forms (auto) or from the CUDA operator's scan (cuda, emulated).
TEST_P(ExtremeScaleTest, RecurrentStepsMatchLogSpaceReference) {
  const std::string& name = GetParam();
  for (const std::string op : {"auto", "cuda"}) {  // cuda: the prefill's state from the CUDA operator's scan
  for (const std::string pattern : {"anti", "opposed"}) {
    for (const double norm : {30.0, 100.0}) {
      const auto in = MakeInputs(norm, pattern);
      const auto ref = RunReference(name, in, torch::kFloat32);
      auto kernel = Make(name, op);
      torch::NoGradGuard no_grad;
      AttentionCall call;
      call.scale = Scale();
      std::unique_ptr<DecodeState> state;
      const int64_t half = kLength / 2;
      std::vector<torch::Tensor> outs = {
          kernel->Decode(state, in.q.narrow(2, 0, half), in.k.narrow(2, 0, half), in.v.narrow(2, 0, half), call)};
      for (int64_t t = half; t < kLength; ++t) {
        outs.push_back(kernel->Decode(state, in.q.narrow(2, t, 1), in.k.narrow(2, t, 1), in.v.narrow(2, t, 1), call));
      }
      const auto out = torch::cat(outs, 2);
      const std::string where = name + " " + op + " decode " + pattern + " |x|=" + std::to_string(int(norm));
      ASSERT_TRUE(AllFinite(out)) << where;
      EXPECT_LE(RelativeError(out, ref.result.out), Tolerance(ref, in)) << where;
    }
  }
  }
}

// Every reference is a prefix maximum: changing later tokens, ordinary or sharp, leaves every
// earlier output bit-identical in every form. (At two threads it failed about once in 60 runs on an
// Intel Xeon until test_main.cpp chose MKL's vector-math kernels first: util/vector_math_kernels.h.)
TEST_P(ExtremeScaleTest, LaterSharpTokensChangeNoEarlierOutput) {
  const std::string& name = GetParam();
  const int64_t later = 24;  // mid-chunk (chunk 16)
  for (const double early_norm : {3.0, 100.0}) {  // early rows ordinary / sharp themselves
    auto base = MakeInputs(early_norm, "anti");
    const auto extreme = MakeInputs(100.0, "opposed");
    auto changed = base;
    changed.q = base.q.clone();
    changed.k = base.k.clone();
    changed.q.narrow(2, later, kLength - later).copy_(extreme.q.narrow(2, later, kLength - later));
    changed.k.narrow(2, later, kLength - later).copy_(extreme.k.narrow(2, later, kLength - later));
    for (const auto& form : kForms) {
      auto kernel = Make(name, form);
      const auto a = RunKernel(kernel, base, torch::kFloat32).out, b = RunKernel(kernel, changed, torch::kFloat32).out;
      const std::string where = name + " " + form + " early |x|=" + std::to_string(int(early_norm));
      ASSERT_TRUE(AllFinite(b)) << where;
      EXPECT_TRUE(torch::equal(a.narrow(2, 0, later), b.narrow(2, 0, later))) << where;
    }
  }
}

// A running maximum that jumps by hundreds inside a sub-chunk and again at a chunk boundary
// (issue 52): with projections of norm 30 (rows 30 e_i), a key y = 30 e_i raises feature i's
// log-feature from about 0 to 450 (and lowers the others to -450). Keys 0..10 are small, key 11
// (inside the sub-chunk [8, 16)) is 30 e_1, key 32 (a chunk's first) is 30 e_5; queries lean
// towards those features. Every form matches the fp64 log-space reference, outputs and
// gradients, and tokens after 12 (inside the jump's sub-chunk) or after 33 change no earlier output.
AttentionKernel MakeJumpKernel(const std::string& name, const std::string& op) {
  KernelShape shape;
  shape.num_heads = kHeads;
  shape.head_dim = kDim;
  const std::string yaml = "{num_features: " + std::to_string(kFeatures) + ", chunk_size: " + std::to_string(kChunk) +
                           ", op: " + op + "}";
  auto kernel = MakeAttentionKernel(name, shape, ConfigReader(YAML::Load(yaml), "attention." + name));
  torch::NoGradGuard no_grad;
  const auto rows = 30.0 * torch::eye(kDim).repeat({kFeatures / kDim, 1});  // m x D
  if (name == "lfk") {
    kernel->named_parameters()["W"].copy_(rows);
  } else {
    kernel->named_buffers()["projection"].copy_(rows);
  }
  return kernel;
}

Inputs JumpInputs() {
  torch::manual_seed(52);
  const double root = std::pow(static_cast<double>(kDim), 0.25);  // the kernels see x = q / d^(1/4)
  Inputs in;
  in.q = 0.5 * root * torch::randn({1, kHeads, kLength, kDim});
  in.q.select(3, 1).add_(2.0 * root);
  in.q.select(3, 5).add_(2.0 * root);
  in.k = 0.3 * root * torch::randn({1, kKvHeads, kLength, kDim});
  in.k[0][0][11].zero_()[1] = 30.0 * root;
  in.k[0][0][32].zero_()[5] = 30.0 * root;
  in.v = torch::randn({1, kKvHeads, kLength, kDim});
  in.weights = torch::randn({1, kHeads, kLength, kDim}).to(torch::kBFloat16).to(torch::kFloat32);
  return in;
}

TEST(ExtremeScaleJumpTest, RunningMaxJumpsInsideASubChunkAndAtAChunkBoundary) {
  const auto in = JumpInputs();
  for (const std::string name : {"performer", "lfk", "darkformer"}) {
    const auto make = [&](const std::string& op) { return MakeJumpKernel(name, op); };
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      const auto ref = RunReference(make, in, dtype);
      ASSERT_GE(ref.max_log_feature, 400) << name;  // the jumps are there
      for (const auto& form : kForms) {
        auto kernel = make(form);
        const std::string where = name + " " + form + " jump" + (dtype == torch::kBFloat16 ? " bf16" : " fp32");
        ExpectMatches(RunKernel(kernel, in, dtype), ref, in, dtype, where);
      }
    }
    for (const int64_t later : {13, 34}) {
      auto changed = in;
      changed.q = in.q.clone();
      changed.k = in.k.clone();
      changed.q.narrow(2, later, kLength - later).mul_(-3.0);
      changed.k.narrow(2, later, kLength - later).normal_().mul_(40.0);
      for (const auto& form : kForms) {
        auto kernel = make(form);
        const auto a = RunKernel(kernel, in, torch::kFloat32).out, b = RunKernel(kernel, changed, torch::kFloat32).out;
        const std::string where = name + " " + form + " tokens from " + std::to_string(later) + " changed";
        ASSERT_TRUE(AllFinite(b)) << where;
        EXPECT_TRUE(torch::equal(a.narrow(2, 0, later), b.narrow(2, 0, later))) << where;
      }
    }
  }
}

}  // namespace
}  // namespace darkformer
