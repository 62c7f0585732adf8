// The host emulation of op: cuda's scan on the device's own count of threads per block, each a fiber
// switched at the barriers (ops/cuda_scan_threads.h), threads and blocks in order and in reverse:
// first that this finds what it is for (a missing barrier, a barrier not every thread reaches) and
// that the block-wide steps see every thread; then that the scan gives, in both orders, the bits
// it gives on one thread: every step's split between threads, every barrier and every block's
// reads of other blocks' writes are as the arithmetic on one thread has them. The device's racecheck
// (gpu_check's sanitize stage) looks at the same on a GPU; this looks on every CPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "attention/ops/cuda_scan_block.h"
#include "attention/ops/cuda_scan_threads.h"
#include "cuda/cuda_op_cases.h"
#include "cuda/test_device.h"
#include "cuda_op_emulated.h"

namespace darkformer {
namespace {

using cuda_scan::Block;
using cuda_scan::HostThreadOrder;
using namespace cuda_op_cases;  // NOLINT: the cases the device tests share

using testing::ThreadOrderScope;

constexpr HostThreadOrder kInOrder{true, false}, kReversed{true, true};

// Each thread writes its element, then reads its right neighbour's: with the barrier between, the
// neighbour's value in both orders; without, the old value where the reader runs first (in order)
// and the new one where it runs after (reversed).
std::vector<int> NeighbourReads(HostThreadOrder order, bool barrier) {
  const ThreadOrderScope scope(order);
  std::vector<int> written(cuda_scan::kThreads, -1), read(cuda_scan::kThreads, 0);
  cuda_scan::RunHostBlock(cuda_scan::kThreads, [&](const Block& b) {
    written[b.tid] = b.tid;
    if (barrier) b.Sync();
    read[b.tid] = written[(b.tid + 1) % b.size];
  });
  return read;
}

TEST(CudaOpThreadsTest, AMissingBarrierReadsOtherwiseInTheTwoOrders) {
  std::vector<int> neighbours(cuda_scan::kThreads);
  for (int t = 0; t < cuda_scan::kThreads; ++t) neighbours[t] = (t + 1) % cuda_scan::kThreads;
  EXPECT_EQ(NeighbourReads(kInOrder, true), neighbours);
  EXPECT_EQ(NeighbourReads(kReversed, true), neighbours);
  EXPECT_NE(NeighbourReads(kInOrder, false), NeighbourReads(kReversed, false));
}

TEST(CudaOpThreadsTest, ABarrierNotEveryThreadReachesIsAnError) {
  const ThreadOrderScope scope(kInOrder);
  EXPECT_THROW(cuda_scan::RunHostBlock(cuda_scan::kThreads,
                                       [](const Block& b) {
                                         if (b.tid < 3) b.Sync();
                                       }),
               std::logic_error);
  // The host thread runs blocks again after it.
  int ran = 0;
  cuda_scan::RunHostBlock(cuda_scan::kThreads, [&](const Block&) { ++ran; });
  EXPECT_EQ(ran, cuda_scan::kThreads);
}

// AnyOf and MinOf over a block's threads: every thread gets the answer that one thread's element
// decides, whichever thread holds it; ParallelFor and BatchedPuts give each element to one thread.
TEST(CudaOpThreadsTest, BlockWideStepsSeeEveryThread) {
  for (const auto order : {kInOrder, kReversed}) {
    const ThreadOrderScope scope(order);
    constexpr int64_t n = 1000;
    std::vector<int> hits(n, 0), puts(n, 0);
    std::vector<char> any_last(cuda_scan::kThreads, 0), any_none(cuda_scan::kThreads, 1);
    std::vector<int64_t> least(cuda_scan::kThreads, -1);
    cuda_scan::RunHostBlock(cuda_scan::kThreads, [&](const Block& b) {
      cuda_scan::ParallelFor(b, n, [&](int64_t i) { ++hits[i]; });
      cuda_scan::ParallelLoad(
          b, n, [&](int64_t i) { return static_cast<float>(i); },
          [&](int64_t i, float x) { puts[i] += static_cast<int>(x) == i ? 1 : 100; });
      any_last[b.tid] = cuda_scan::AnyOf(b, n, [&](int64_t i) { return i == n - 1; });
      any_none[b.tid] = cuda_scan::AnyOf(b, n, [](int64_t) { return false; });
      least[b.tid] = cuda_scan::MinOf(b, n, 2 * n, [&](int64_t i) { return i == 777 ? int64_t{5} : 2 * n; });
    });
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(hits[i], 1) << i;
      ASSERT_EQ(puts[i], 1) << i;
    }
    for (int t = 0; t < cuda_scan::kThreads; ++t) {
      EXPECT_TRUE(any_last[t]) << t;
      EXPECT_FALSE(any_none[t]) << t;
      EXPECT_EQ(least[t], 5) << t;
    }
  }
}

// Performer (one key row) and darkformer (a key row per query head), fp32 on CUDA cores and bf16 on
// tensor cores, the jumps and a document start inside a sub-chunk, whole rows and segments of one
// chunk, in three cuts: chunks of two sub-chunks of 8 (16 features); one sub-chunk of 32 (72
// features: two panels' rows of queries, a panel and the threads' tail columns of features); and
// the pairs by exponentials (40 features). Outputs and every gradient to the bit of one thread's,
// with the threads and blocks in order and reversed. Under deterministic algorithms (darkformer's
// dv otherwise adds in the blocks' order).
struct Cut {
  int64_t chunk, features, sub_chunk;
  std::string pairs;
};

TEST(CudaOpThreadsTest, TheDevicesThreadsGiveOneThreadsBitsInEitherOrder) {
  if (testing::TestDevice() != torch::kCPU) GTEST_SKIP() << "the host emulation's property; the device runs its own";
  const testing::DeterministicScope deterministic(true);
  const auto in = MakeInputs("jump");
  const auto ids = TwoDocuments();
  for (const Cut& cut : {Cut{kChunk, kFeatures, 0, ""}, Cut{32, 72, 32, ""}, Cut{kChunk, 40, 0, "exponentials"}}) {
    for (const std::string name : {"performer", "darkformer"}) {
      const int64_t rows = name == "performer" ? kKvHeads : kHeads;
      for (const bool bf16 : {false, true}) {
        for (const int64_t per_segment : {int64_t{0}, int64_t{1}}) {
          const std::string where = name + (bf16 ? " bf16" : " fp32") + " chunk " + std::to_string(cut.chunk) +
                                    " features " + std::to_string(cut.features) + " sub_chunk " +
                                    std::to_string(cut.sub_chunk) + " " + cut.pairs +
                                    (per_segment > 0 ? ", segments of one chunk" : ", whole rows");
          const ResidentBlocksScope blocks(per_segment > 0 ? rows * per_segment : 0);
          auto make = [&] {
            return Make(name, "cuda", 30.0, cut.chunk, cut.features, kHeads, cut.sub_chunk, 0, cut.pairs);
          };
          auto one_kernel = make();
          const auto one = [&] {
            const ThreadOrderScope one_thread({});
            return RunKernel(one_kernel, in, torch::kCPU, torch::kFloat32, ids, bf16);
          }();
          for (const auto order : {kInOrder, kReversed}) {
            const ThreadOrderScope scope(order);
            auto kernel = make();
            const auto threads = RunKernel(kernel, in, torch::kCPU, torch::kFloat32, ids, bf16);
            ExpectSameBits(one, threads, where + (order.reversed ? ", reversed" : ", in order"));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace darkformer
