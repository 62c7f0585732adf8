// A sub-chunk's own pairs as products (cuda_scan_body.h's FactoredQueries): for its queries before
// the first position where a feature's running max has grown past kMaxPairGrowth or a document
// starts, w = qe ke^T and the backward's da and dl are matrix products; from there on, the
// exponentials pair by pair. Both paths hold the rule against the fp64 chunk loop, and the choice
// reads no later token.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "cuda/cuda_op_cases.h"
#include "cuda/test_device.h"
#include "cuda_op_emulated.h"

namespace darkformer {
namespace {

using namespace cuda_op_cases;  // NOLINT: the cases the device tests share

// With every pair by exponentials (the kernel's `pairs: exponentials`), the ordinary rows, sharp
// rows, the jumps and packed documents meet the rule as the products do (every other
// DeviceCudaOpTest runs the default, the products where they factor), fp32 and bf16 on tensor cores.
TEST(DeviceCudaOpTest, PairsByExponentialsHoldTheRuleToo) {
  for (const std::string name : {"performer", "darkformer"}) {
    for (const bool bf16 : {false, true}) {
      ExpectMatches(name, "ordinary", 0, {}, bf16, kChunk, kFeatures, "cuda", 0, "exponentials");
      ExpectMatches(name, "sharp", 3600.0 / std::sqrt(8.0), {}, bf16, kChunk, kFeatures, "cuda", 0, "exponentials");
      ExpectMatches(name, "jump", 900.0, TwoDocuments(), bf16, kChunk, kFeatures, "cuda", 0, "exponentials");
    }
  }
}

// Key 11 raises feature 1's max by ~450 inside the sub-chunk [8, 16) (chunk 16, sub-chunks of 8):
// its queries 8, 9 and 10 read their pairs as products, 11 to 15 by exponentials. So the outputs
// at 11 to 15 are the bits the exponentials give everywhere (their pairs, their state read and
// the state they read are the same steps), and those at 8 to 10 are not (the products round
// otherwise). Then the same with every position after 11 changed: the products' positions keep
// their bits (the choice reads no later key).
TEST(DeviceCudaOpTest, PairsFactorUpToAJumpAndNotFromIt) {
  const auto device = testing::TestDevice();
  for (const std::string name : {"performer", "darkformer"}) {
    const std::string where = name + " on " + device.str();
    auto in = MakeInputs("jump");
    auto products_kernel = Make(name, "cuda", 30.0);
    const auto products = RunKernel(products_kernel, in, device, torch::kFloat32);
    auto exponentials_kernel = Make(name, "cuda", 30.0, kChunk, kFeatures, kHeads, 0, 0, "exponentials");
    const auto exponentials = RunKernel(exponentials_kernel, in, device, torch::kFloat32);
    const auto at = [](const Result& r, int64_t from, int64_t count) { return r.out.narrow(2, from, count); };
    EXPECT_TRUE(torch::equal(at(products, 11, 5), at(exponentials, 11, 5))) << where << ": from the jump on";
    EXPECT_FALSE(torch::equal(at(products, 8, 3), at(exponentials, 8, 3))) << where << ": before the jump";
    // Later keys and values changed: the earlier outputs keep their bits.
    auto later = in;
    later.k = in.k.clone();
    later.v = in.v.clone();
    later.k.narrow(2, 12, kLength - 12).mul_(-3.0);
    later.v.narrow(2, 12, kLength - 12).add_(1.0);
    auto later_kernel = Make(name, "cuda", 30.0);
    const auto changed = RunKernel(later_kernel, later, device, torch::kFloat32);
    EXPECT_TRUE(torch::equal(at(products, 0, 12), at(changed, 0, 12))) << where << ": later tokens changed";
  }
}

}  // namespace
}  // namespace darkformer
