// Every form of every registered kernel on the test device (DARKFORMER_TEST_DEVICE; cuda in
// tools/gpu_check.sh) equals the naive reference computed on the CPU in fp64: outputs and the
// gradients of q, k, v and the kernel's parameters, with fp32 and bf16 inputs; and prefill plus
// recurrent steps on the device equal the reference rows. Tolerances are the CPU rule of
// tests/attention/extreme_scale_test.cpp at moderate scale: 1e-4 relative to the largest output,
// 1e-3 for gradients; bf16 outputs and input gradients are stored in bf16, so at least 2^-8, and
// 2^-6 for exact and constant, which compute in bf16 too (CPU: 5.7e-3 and 4.7e-3).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "attention/attention_flops.h"
#include "attention/derf_test_state.h"
#include "attention/kernel_registry.h"
#include "cuda_op_emulated.h"
#include "cuda/test_device.h"

namespace darkformer {
namespace {

constexpr int64_t kBatch = 2, kHeads = 2, kKvHeads = 1, kLength = 40, kDim = 8, kFeatures = 16, kChunk = 16;

// The causal operator's forms; kernels without an `op` option (exact, constant) have one form.
// cuda: the CUDA operator (ops/cuda_op.h) on a GPU; on the CPU its scan emulated on the host
// (cuda_op_emulated.h).
const std::vector<std::string> kForms = {"naive", "chunk_loop", "chunk_parallel", "auto", "cuda"};

std::string Options(const std::string& name, const std::string& op) {
  std::string yaml = "{num_features: " + std::to_string(kFeatures) + ", chunk_size: " + std::to_string(kChunk);
  if (!op.empty()) yaml += ", op: " + op;
  if (name == "gerf") yaml += ", a: -0.2";
  return yaml + "}";
}

// Whether the kernel has the feature operator's `op` (its factory rejects unknown keys).
bool HasForms(const std::string& name) {
  KernelShape shape{kHeads, kDim};
  try {
    MakeAttentionKernel(name, shape, ConfigReader(YAML::Load(Options(name, "naive")), "attention." + name));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The same kernel every call (seeded draws), its parameters moved off their identity-like
// initialisation so that their gradients mean something.
AttentionKernel Make(const std::string& name, const std::string& op) {
  KernelShape shape{kHeads, kDim};
  torch::manual_seed(5);
  const std::string yaml = HasForms(name) ? Options(name, op) : "{}";
  auto kernel = MakeAttentionKernel(name, shape, ConfigReader(YAML::Load(yaml), "attention." + name));
  torch::NoGradGuard no_grad;
  torch::manual_seed(6);
  for (auto& p : kernel->parameters()) p.add_(0.1 * torch::randn_like(p));
  PerturbDerf(*kernel, 0.3, 12);
  return kernel;
}

struct Inputs {
  torch::Tensor q, k, v, weights;
};
Inputs MakeInputs() {
  torch::manual_seed(7);
  Inputs in{torch::randn({kBatch, kHeads, kLength, kDim}), torch::randn({kBatch, kKvHeads, kLength, kDim}),
            torch::randn({kBatch, kKvHeads, kLength, kDim}),
            // bf16-representable: a bf16 output's upstream gradient arrives unrounded.
            torch::randn({kBatch, kHeads, kLength, kDim}).to(torch::kBFloat16).to(torch::kFloat32)};
  return in;
}

struct Result {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;  // q, k, v, then the kernel's parameters
};

double Scale() { return 1.0 / std::sqrt(static_cast<double>(kDim)); }

// The kernel's parameters in `compute` on `device`; the inputs rounded to `input_dtype`.
Result RunOn(AttentionKernel& kernel, const Inputs& in, torch::Device device, torch::ScalarType input_dtype,
           torch::ScalarType compute) {
  kernel->to(device, compute);
  // fp64 leaves for the reference (of the rounded inputs); the inputs' own dtype otherwise.
  auto leaf = [&](const torch::Tensor& t) {
    auto x = t.to(input_dtype);
    if (compute == torch::kFloat64) x = x.to(torch::kFloat64);
    return x.to(device).detach().clone().requires_grad_();
  };
  auto q = leaf(in.q), k = leaf(in.k), v = leaf(in.v);
  AttentionCall call;
  call.scale = Scale();
  const auto out = kernel->forward(q, k, v, call);
  (out.to(torch::kFloat64) * in.weights.to(device, torch::kFloat64)).sum().backward();
  auto cpu = [](const torch::Tensor& g) { return g.defined() ? g.cpu() : torch::Tensor(); };  // constant: no q, k grads
  Result r{out.detach().cpu(), {cpu(q.grad()), cpu(k.grad()), cpu(v.grad())}};
  for (auto& p : kernel->parameters()) r.grads.push_back(cpu(p.grad()));
  return r;
}

double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  const auto b64 = b.to(torch::kFloat64);
  return ((a.to(torch::kFloat64) - b64).abs().max() / b64.abs().max().clamp_min(1e-300)).item<double>();
}

// bf16_ulps: the bf16 roundings a bf16 result carries; 1 (storage) for the feature kernels, whose
// features and sums are fp32; exact (SDPA) and constant compute in the inputs' dtype, so 4.
void ExpectMatches(const Result& got, const Result& ref, torch::ScalarType dtype, double bf16_ulps,
                   const std::string& where) {
  const double storage = dtype == torch::kBFloat16 ? bf16_ulps * std::ldexp(1.0, -8) : 0.0;
  ASSERT_TRUE(torch::isfinite(got.out).all().item<bool>()) << where << ": non-finite output";
  EXPECT_LE(RelativeError(got.out, ref.out), std::max(1e-4, storage)) << where << " output";
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << where;
  for (size_t i = 0; i < got.grads.size(); ++i) {
    ASSERT_EQ(got.grads[i].defined(), ref.grads[i].defined()) << where << " grad " << i;
    if (!got.grads[i].defined()) continue;
    const double tol = i < 3 ? std::max(1e-3, storage) : 1e-3;
    EXPECT_LE(RelativeError(got.grads[i], ref.grads[i]), tol) << where << " grad " << i;
  }
}

class DeviceFormsTest : public ::testing::TestWithParam<std::string> {};

std::vector<std::string> DeterministicKernels() {
  std::vector<std::string> names;
  // `random` draws its weights from the device's generator in every forward: no CPU twin exists.
  for (const auto& name : KernelNames()) {
    if (name != "random") names.push_back(name);
  }
  return names;
}

INSTANTIATE_TEST_SUITE_P(Kernels, DeviceFormsTest, ::testing::ValuesIn(DeterministicKernels()),
                         [](const auto& info) { return info.param; });

TEST_P(DeviceFormsTest, EveryFormEqualsTheCpuFp64Reference) {
  const std::string& name = GetParam();
  const auto device = testing::TestDevice();
  const auto in = MakeInputs();
  const auto forms = HasForms(name) ? kForms : std::vector<std::string>{""};
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto reference_kernel = Make(name, forms.front());
    const auto ref = RunOn(reference_kernel, in, torch::kCPU, dtype, torch::kFloat64);
    for (const auto& form : forms) {
      auto kernel = Make(name, form);
      const std::string where = name + " " + (form.empty() ? "-" : form) + " on " + device.str() +
                                (dtype == torch::kBFloat16 ? " bf16" : " fp32");
      ExpectMatches(RunOn(kernel, in, device, dtype, torch::kFloat32), ref, dtype, HasForms(name) ? 1.0 : 4.0, where);
    }
  }
}

// A training run's TF32 (train.tf32: auto, on for CUDA): bf16 inputs, every form of every kernel,
// the same rule; the products feeding features stay fp32-accurate (ops/fp32_products.h).
TEST_P(DeviceFormsTest, UnderTrainingsTf32EveryFormKeepsTheBf16Rule) {
  const std::string& name = GetParam();
  const testing::Tf32Scope tf32(true);
  const auto device = testing::TestDevice();
  const auto in = MakeInputs();
  const auto forms = HasForms(name) ? kForms : std::vector<std::string>{""};
  auto reference_kernel = Make(name, forms.front());
  const auto ref = RunOn(reference_kernel, in, torch::kCPU, torch::kBFloat16, torch::kFloat64);
  for (const auto& form : forms) {
    auto kernel = Make(name, form);
    const std::string where = name + " " + (form.empty() ? "-" : form) + " on " + device.str() + " bf16, TF32";
    ExpectMatches(RunOn(kernel, in, device, torch::kBFloat16, torch::kFloat32), ref, torch::kBFloat16,
                  HasForms(name) ? 1.0 : 4.0, where);
  }
}

// Prefill of the first half, then one recurrent step per token, on the device.
TEST_P(DeviceFormsTest, PrefillAndRecurrentStepsEqualTheReference) {
  const std::string& name = GetParam();
  const auto device = testing::TestDevice();
  const auto in = MakeInputs();
  auto reference_kernel = Make(name, HasForms(name) ? "naive" : "");
  const auto ref = RunOn(reference_kernel, in, torch::kCPU, torch::kFloat32, torch::kFloat64);
  auto kernel = Make(name, HasForms(name) ? "auto" : "");
  kernel->to(device);
  torch::NoGradGuard no_grad;
  AttentionCall call;
  call.scale = Scale();
  const auto q = in.q.to(device), k = in.k.to(device), v = in.v.to(device);
  std::unique_ptr<DecodeState> state;
  const int64_t half = kLength / 2;
  std::vector<torch::Tensor> outs = {
      kernel->Decode(state, q.narrow(2, 0, half), k.narrow(2, 0, half), v.narrow(2, 0, half), call)};
  for (int64_t t = half; t < kLength; ++t) {
    outs.push_back(kernel->Decode(state, q.narrow(2, t, 1), k.narrow(2, t, 1), v.narrow(2, t, 1), call));
  }
  const auto out = torch::cat(outs, 2).cpu();
  EXPECT_LE(RelativeError(out, ref.out), 1e-4) << name << " decode on " << device.str();
}

// The FLOP count the trainer logs reads the feature dimension off a dummy row, made on the
// kernel's device: on CUDA it once met the kernel's projection on the GPU with a CPU row, and
// every trainer run with a feature kernel stopped there.
TEST_P(DeviceFormsTest, FlopCountRunsWhereTheKernelLives) {
  const std::string& name = GetParam();
  auto kernel = Make(name, HasForms(name) ? "auto" : "");
  const double on_cpu = AttentionForwardFlopsPerToken(*kernel, kHeads, kKvHeads, kDim, kLength);
  const auto device = testing::TestDevice();
  kernel->to(device);
  EXPECT_EQ(AttentionForwardFlopsPerToken(*kernel, kHeads, kKvHeads, kDim, kLength), on_cpu) << name << " on " << device;
}

}  // namespace
}  // namespace darkformer
