// op: cuda at a head wider than a panel (Dv = 66: the [v, 1] products' 67 columns are a panel and
// 3 tail columns) with 128 features, where the state read's tail (G S rows, 128 deep) is split
// between threads in runs (cuda_scan_matmul.h's TailParts: 10 for darkformer's 8 rows, 5 for
// performer's 16): against the chunk loop in fp64 by the rule of the other device tests, fp32 and
// bf16 on tensor cores; on the CPU also on the device's threads in both orders, to the bit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention/kernel_registry.h"
#include "attention/ops/cuda_scan_threads.h"
#include "cuda/cuda_op_cases.h"
#include "cuda/test_device.h"
#include "cuda_op_emulated.h"

namespace darkformer {
namespace {

constexpr int64_t kWideHeads = 2, kWideDim = 66, kWideFeatures = 128, kWideLength = 40;

std::vector<torch::Tensor> RunWide(const std::string& name, const std::string& op, torch::Device on,
                               torch::ScalarType compute, bool bf16) {
  KernelShape shape{kWideHeads, kWideDim};
  const std::string yaml = "{num_features: " + std::to_string(kWideFeatures) + ", chunk_size: 16, op: " + op + "}";
  auto kernel = MakeAttentionKernel(name, shape, ConfigReader(YAML::Load(yaml), "attention." + name));
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(6);
    for (auto& p : kernel->parameters()) p.add_(0.1 * torch::randn_like(p));  // darkformer: M per head
  }
  kernel->to(on, compute);
  torch::manual_seed(66);
  const auto q = torch::randn({1, kWideHeads, kWideLength, kWideDim}), k = torch::randn({1, 1, kWideLength, kWideDim}),
             v = torch::randn({1, 1, kWideLength, kWideDim});
  const auto weights = torch::randn({1, kWideHeads, kWideLength, kWideDim}).to(torch::kBFloat16).to(torch::kFloat64);
  const auto dtype = compute == torch::kFloat64 ? compute : (bf16 ? torch::kBFloat16 : torch::kFloat32);
  auto leaf = [&](const torch::Tensor& t) {
    return (bf16 ? t.to(torch::kBFloat16) : t).to(on, dtype).detach().clone().requires_grad_();
  };
  auto qd = leaf(q), kd = leaf(k), vd = leaf(v);
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(kWideDim));
  const auto out = kernel->forward(qd, kd, vd, call);
  (out.to(torch::kFloat64) * weights.to(on)).sum().backward();
  std::vector<torch::Tensor> r{out.detach().cpu(), qd.grad().cpu(), kd.grad().cpu(), vd.grad().cpu()};
  for (auto& p : kernel->parameters()) r.push_back(p.grad().defined() ? p.grad().cpu() : torch::Tensor());
  return r;
}

TEST(DeviceCudaOpTest, WideValuesSplitTheStateReadsTailBetweenThreads) {
  const testing::DeterministicScope deterministic(true);  // the bit comparison below: dv without atomics
  const auto device = testing::TestDevice();
  for (const std::string name : {"performer", "darkformer"}) {
    for (const bool bf16 : {false, true}) {
      const std::string where = name + (bf16 ? " bf16" : " fp32") + " on " + device.str();
      const auto ref = RunWide(name, "chunk_loop", torch::kCPU, torch::kFloat64, bf16);
      const auto got = RunWide(name, "cuda", device, torch::kFloat32, bf16);
      const double storage = bf16 ? std::ldexp(1.0, -8) : 0.0;
      ASSERT_EQ(got.size(), ref.size()) << where;
      EXPECT_LE(cuda_op_cases::RelativeError(got[0], ref[0]), std::max(1e-4, storage)) << where << " output";
      for (size_t i = 1; i < got.size(); ++i) {
        if (!ref[i].defined()) continue;
        EXPECT_LE(cuda_op_cases::RelativeError(got[i], ref[i]), std::max(1e-3, i < 4 ? storage : 0.0))
            << where << " grad " << i;
      }
      if (!device.is_cpu()) continue;
      for (const bool reversed : {false, true}) {
        const testing::ThreadOrderScope order({/*device_threads=*/true, reversed});
        const auto threads = RunWide(name, "cuda", device, torch::kFloat32, bf16);
        for (size_t i = 0; i < got.size(); ++i) {
          if (got[i].defined()) EXPECT_TRUE(torch::equal(got[i], threads[i])) << where << " threads, " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace darkformer
