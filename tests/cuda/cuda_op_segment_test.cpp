// op: cuda walks each row in segments of chunks (cuda_op_launch::SegmentChunks: as many per row as
// the per-chunk blocks that run at once cover), the state entering a segment carried forward and
// the reverse state leaving it carried back: the same merges in the same order as a whole row's,
// so the same bits. What a call holds per position then falls to one state per segment
// (cuda_op_memory_test.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "attention/ops/cuda_op_launch.h"
#include "cuda/cuda_op_cases.h"
#include "cuda/test_device.h"
#include "cuda_op_emulated.h"

namespace darkformer {
namespace {

using namespace cuda_op_cases;  // NOLINT: the cases the device tests share

// Segments of one chunk and of two (the last then shorter), against whole rows: outputs and every
// gradient to the bit, performer (one key row) and darkformer (a key row per query head), chunks
// of one sub-chunk (8: five chunks) and of two (16: three), the running max jumping inside a
// sub-chunk and at a chunk's first position, a document starting inside a sub-chunk, on CUDA cores
// and on tensor cores. Under deterministic algorithms: darkformer's dv otherwise adds with atomics.
TEST(DeviceCudaOpTest, SegmentsGiveTheSameBits) {
  const testing::DeterministicScope deterministic(true);
  const auto device = testing::TestDevice();
  const auto on = torch::empty({0}, torch::TensorOptions().device(device));
  const auto in = MakeInputs("jump");
  const auto ids = TwoDocuments();
  for (const std::string name : {"performer", "darkformer"}) {
    const int64_t rows = name == "performer" ? kKvHeads : kHeads;  // key rows: per query head under M
    for (const int64_t chunk : {8, 16}) {
      for (const bool bf16 : {false, true}) {
        const std::string where = name + (bf16 ? " bf16" : " fp32") + " chunk " + std::to_string(chunk) + " on " +
                                  device.str();
        // A kernel each: the parameters' gradients would otherwise add up over the backwards.
        auto whole_kernel = Make(name, "cuda", 30.0, chunk, /*features=*/40);
        ASSERT_GE(cuda_op_launch::SegmentChunks(rows, on, /*backward=*/false), kLength / chunk + 1) << where;
        const auto whole = RunKernel(whole_kernel, in, device, torch::kFloat32, ids, bf16);
        for (const int64_t per_segment : {1, 2}) {
          const ResidentBlocksScope blocks(rows * per_segment);
          ASSERT_EQ(cuda_op_launch::SegmentChunks(rows, on, /*backward=*/true), per_segment) << where;
          auto kernel = Make(name, "cuda", 30.0, chunk, 40);
          const auto segmented = RunKernel(kernel, in, device, torch::kFloat32, ids, bf16);
          ExpectSameBits(whole, segmented, where + ", segments of " + std::to_string(per_segment));
        }
      }
    }
  }
}

// The kernel's key `segment_chunks` sets the segment whatever the device runs at once: 1, 2 and
// one past the row's chunks (whole rows) give the bits of the default (whole rows on the host,
// and on a device whose blocks cover these rows).
TEST(DeviceCudaOpTest, SegmentChunksKeyGivesTheSameBits) {
  const testing::DeterministicScope deterministic(true);
  const auto device = testing::TestDevice();
  const auto in = MakeInputs("jump");
  const auto ids = TwoDocuments();
  constexpr int64_t chunk = 8;  // five chunks of one sub-chunk
  for (const std::string name : {"performer", "darkformer"}) {
    auto whole_kernel = Make(name, "cuda", 30.0, chunk, /*features=*/40);
    const auto whole = RunKernel(whole_kernel, in, device, torch::kFloat32, ids);
    for (const int64_t segment_chunks : {int64_t{1}, int64_t{2}, kLength / chunk + 1}) {
      auto kernel = Make(name, "cuda", 30.0, chunk, 40, kHeads, /*sub_chunk=*/0, segment_chunks);
      ExpectSameBits(whole, RunKernel(kernel, in, device, torch::kFloat32, ids),
                     name + " segment_chunks " + std::to_string(segment_chunks) + " on " + device.str());
    }
  }
}

}  // namespace
}  // namespace darkformer
