// Helpers shared by the fused causal operator's tests: the kernels under test, a kernel of each
// variant with non-trivial parameters, the relative error they are held to, and the test fixture
// whose parameter is the kernels' `op` (instantiated once, in fused_causal_attention_test.cpp).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "attention/derf_test_state.h"
#include "attention/kernel_registry.h"
#include "attention/kernel_traits.h"

namespace darkformer {
namespace fused_causal_test {

// darkformer-shared: one M for all heads; darkformer-rank2: M is 2 x d (a low-rank Sigma);
// darkformer-queries: M per head on the queries only (per-head parameters, keys per KV head);
// darkformer-softmax: importance-weighted draws (per-head parameters, keys per query head, no
// positive form).
inline std::vector<std::string> FeatureKernels() {
  auto names = KernelNames(KernelFamily::kPositive);
  names.insert(names.end(), {"darkformer-shared", "darkformer-rank2", "darkformer-queries", "darkformer-softmax"});
  return names;
}
inline const std::vector<std::string> kFeatureKernels = FeatureKernels();

inline AttentionKernel Make(const std::string& variant, int64_t heads, int64_t d, int64_t m, int64_t chunk, const std::string& op) {
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

inline double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max() /
          b.to(torch::kFloat64).abs().max().clamp_min(1e-30))
      .item<double>();
}

// The parameter: the kernels' `op`.
class FusedCausalAttentionTest : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string& op() const { return GetParam(); }
};

}  // namespace fused_causal_test
}  // namespace darkformer
