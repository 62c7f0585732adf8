// op: cuda walks each row in segments of chunks (cuda_op_launch::SegmentChunks: as many per row as
// the per-chunk blocks that run at once cover), the state entering a segment carried forward and
// the reverse state leaving it carried back: the same merges in the same order as a whole row's,
// so the same bits. What a call holds per position then falls to one state per segment
// (cuda_op_memory_test.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
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

// The default segment: as few as what runs at once allows, as even as they can be, so as many
// launches at fewer states: 32 chunks at most 17 a segment are two of 16, 5 at most 4 two of 3;
// a row within what runs at once is one segment; the last may be shorter (5 at most 2: 2, 2, 1).
TEST(CudaOpSegmentTest, DefaultSegmentsAsEvenAsTheirCountAllows) {
  struct Case {
    int64_t most, chunks, segment;
  };
  for (const auto& c : {Case{17, 32, 16}, Case{4, 5, 3}, Case{2, 5, 2}, Case{1, 5, 1}, Case{5, 5, 5}, Case{132, 32, 32},
                        Case{17, 512, 17}, Case{16, 17, 9}, Case{std::numeric_limits<int64_t>::max(), 5, 5}}) {
    const int64_t got = cuda_op_launch::EvenSegment(c.most, c.chunks);
    EXPECT_EQ(got, c.segment) << c.chunks << " chunks at most " << c.most;
    // No more segments than the longest allows, none longer than it.
    EXPECT_LE(got, c.most);
    EXPECT_EQ((c.chunks + got - 1) / got, c.chunks / c.most + (c.chunks % c.most != 0 ? 1 : 0));
  }
  // A launch takes it: 5 chunks (chunk 8 over 40 positions) with 4 a segment's worth of blocks per row.
  const auto on = torch::empty({0}, torch::TensorOptions().device(testing::TestDevice()));
  const int64_t rows = 2;
  const ResidentBlocksScope blocks(rows * 4);
  torch::Tensor ids, resets;
  const auto v = torch::zeros({1, rows, kLength, 8}, on.options());
  const auto cut = cuda_op_launch::ChunkingFor(8, 0);
  const auto launch = cuda_op_launch::MakeLaunch(rows, rows, 16, v, cut.sub, cut.chunk_subs, torch::Tensor(), ids,
                                                 resets, cuda_op_launch::Pass::kBackward);
  ASSERT_EQ(launch.Chunks(), 5);
  EXPECT_EQ(launch.Segment(), 3);
  EXPECT_EQ(launch.Segments(), 2);
}

}  // namespace
}  // namespace darkformer
