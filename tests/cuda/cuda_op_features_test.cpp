// op: cuda's features precomputed (the kernel's precompute_features key): both sides' base-2
// log-features by one LibTorch product before each pass, which the scan reads instead of projecting
// a sub-chunk's queries and keys inside each launch (cuda_op_launch.h's ScanFeatures), and the
// gradients through the map in LibTorch after it (feature_gradients.h's FeatureBackward). The
// memory it holds for that: cuda_op_memory_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "cuda/cuda_op_cases.h"
#include "cuda/test_device.h"
#include "cuda_op_emulated.h"

namespace darkformer {
namespace {

using namespace cuda_op_cases;  // NOLINT: the cases the device tests share

// The rule against the fp64 chunk loop, as the features projected inside meet it: ordinary rows,
// sharp opposed rows of norm 60, the jumps with two documents, and the jumps at longer sub-chunks;
// performer's shared map and darkformer's per-head M (its keys per query head); fp32, and bf16 on
// the tensor cores.
TEST(DeviceCudaOpTest, PrecomputedFeaturesHoldTheRule) {
  for (const std::string name : {"performer", "darkformer"}) {
    for (const bool bf16 : {false, true}) {
      ExpectMatches(name, "ordinary", 0, {}, bf16, kChunk, kFeatures, "cuda", 0, "", /*precompute=*/true);
      ExpectMatches(name, "sharp", 3600.0 / std::sqrt(8.0), {}, bf16, kChunk, kFeatures, "cuda", 0, "", true);
      ExpectMatches(name, "jump", 900.0, TwoDocuments(), bf16, kChunk, kFeatures, "cuda", 0, "", true);
      ExpectMatches(name, "jump", 900.0, TwoDocuments(), bf16, 64, kFeatures, "cuda", /*sub_chunk=*/32, "", true);
    }
  }
}

// The scan's arithmetic is the same either way, its log-features not to the bit (their products
// sum in another order, the log2(e) applied elsewhere): on ordinary rows, where each is within the
// rule's 1e-4 of the fp64 reference, the two agree within twice that, and differ in their bits
// (the key reached the operator).
TEST(DeviceCudaOpTest, PrecomputedFeaturesAreTheFeaturesProjectedInside) {
  const auto device = testing::TestDevice();
  const auto in = MakeInputs("ordinary");
  for (const std::string name : {"performer", "darkformer"}) {
    auto inside_kernel = Make(name, "cuda", 0);
    auto given_kernel = Make(name, "cuda", 0, kChunk, kFeatures, kHeads, 0, 0, "", /*precompute=*/true);
    const auto inside = RunKernel(inside_kernel, in, device, torch::kFloat32);
    const auto given = RunKernel(given_kernel, in, device, torch::kFloat32);
    const std::string where = name + " on " + device.str();
    EXPECT_FALSE(torch::equal(inside.out, given.out)) << where << ": the same bits, so the key did nothing";
    EXPECT_LE(RelativeError(given.out, inside.out), 2 * 1e-4) << where;
  }
}

// Another form refuses the key, naming it: it would do nothing there.
TEST(DeviceCudaOpTest, PrecomputedFeaturesOnAnotherFormAreRefused) {
  for (const std::string op : {"auto", "chunk_parallel", "chunk_loop"}) {
    try {
      Make("performer", op, 0, kChunk, kFeatures, kHeads, 0, 0, "", /*precompute=*/true);
      ADD_FAILURE() << "op: " << op << " took precompute_features";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("attention.performer.precompute_features"), std::string::npos) << what;
      EXPECT_NE(what.find("op: cuda only"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace darkformer
