// Where a block of op: cuda's per-chunk kernels keeps its scratch (Launch::scratch_shared): in its
// shared memory where the device holds it beside the products' panels, else in global memory.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "attention/ops/cuda_scan.h"
#include "cuda/cuda_op_cases.h"
#include "cuda/test_device.h"
#include "cuda_op_emulated.h"

namespace darkformer {
namespace {

using namespace cuda_op_cases;  // NOLINT: the cases the device tests share

// A block's scratch in its shared memory (where the device holds it: every case of the device tests) or
// in global memory gives the same bits, outputs and every gradient, on CUDA cores and tensor
// cores, with documents and sub-chunks of 8 and 16, under deterministic algorithms (darkformer's dv
// otherwise adds with atomics). On the CPU both runs are the host emulation's, whose scratch is
// always global.
TEST(DeviceCudaOpTest, ScratchInSharedOrGlobalMemoryGivesTheSameBits) {
  const testing::DeterministicScope deterministic(true);
  const auto device = testing::TestDevice();
  const auto in = MakeInputs("jump");
  const auto ids = TwoDocuments();
  for (const std::string name : {"performer", "darkformer"}) {
    const int64_t group = name == "performer" ? kHeads / kKvHeads : 1;  // query heads per key row
    for (const int64_t sub_chunk : {8, 16}) {
      if (device.is_cuda()) {
        ASSERT_TRUE(cuda_scan::ScratchFitsInSharedMemory(cuda_scan::Scratch::Floats(40, kDim, group, sub_chunk, true)))
            << name << " sub_chunk " << sub_chunk;
      }
      for (const bool bf16 : {false, true}) {
        // A kernel each: the parameters' gradients would otherwise add up over the two backwards.
        auto one = Make(name, "cuda", 30.0, /*chunk=*/32, /*features=*/40, kHeads, sub_chunk);
        auto two = Make(name, "cuda", 30.0, 32, 40, kHeads, sub_chunk);
        const auto shared = RunKernel(one, in, device, torch::kFloat32, ids, bf16);
        Result global;
        {
          const GlobalScratchScope scope;
          global = RunKernel(two, in, device, torch::kFloat32, ids, bf16);
        }
        const std::string where = name + (bf16 ? " bf16" : " fp32") + " sub_chunk " + std::to_string(sub_chunk) +
                                  " on " + device.str();
        ExpectSameBits(shared, global, where);
      }
    }
  }
}

}  // namespace
}  // namespace darkformer
