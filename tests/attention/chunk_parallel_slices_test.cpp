// The chunk-parallel form in slices (ops/chunk_parallel.h): its terms made for a slice of key rows
// at a time, whole sequences or a sequence's rows, forward and backward.
//   - ChunkParallelSlice: as many whole sequences as fit the budget, else rows of one, one at
//     least, the slices even.
//   - Sliced calls compute what the whole call computes: outputs and the gradients of x, y, v and
//     W, in fp64, with packed documents and without, for keys shared by query heads (G = 2) and
//     keys per query head (G = 1), slices of several sequences, of one, and of one row. Bound: the
//     CPU rule bounds one fp32 computation's rounding at 1e-4 (outputs) and 1e-3 (gradients)
//     relative to the largest; in fp64 the same operations round 2^29 times finer, and two such
//     computations differ by at most twice that.
//   - Slices hold less: the backward's measured peak (LibTorch's allocator) falls with the slice,
//     and ChunkParallelWorkingBytes (the memory estimate's) says it within the estimate's 15%.
#include <c10/util/ThreadLocalDebugInfo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention/ops/chunk_parallel.h"
#include "attention/ops/feature_map.h"
#include "attention/positive_features.h"
#include "util/peak_memory.h"

namespace darkformer {
namespace {

constexpr int64_t kLength = 40, kDim = 8, kFeatures = 16, kChunk = 16;

ChunkParallelDims Dims(int64_t batch, int64_t heads, int64_t rows) {
  return {batch, kLength, heads, rows, kFeatures, kDim, kChunk};
}
int64_t PerRow(const ChunkParallelDims& d) { return ChunkParallelWorkingBytes(d, 1) - ChunkParallelWorkingBytes(d, 0); }

TEST(ChunkParallelSlicesTest, SlicesTakeWholeSequencesWhereOneFitsElseRowsOfOne) {
  auto d = Dims(3, 8, 4);
  const int64_t row = PerRow(d);
  ASSERT_GT(row, 0);
  EXPECT_EQ(ChunkParallelWorkingBytes(d, 2) - ChunkParallelWorkingBytes(d, 1), row);  // linear in rows
  EXPECT_EQ(ChunkParallelSlice(d, int64_t{1} << 62), 12);   // the whole call
  EXPECT_EQ(ChunkParallelSlice(d, 8 * row), 8);             // 2 sequences fit: slices of 2 and 1
  EXPECT_EQ(ChunkParallelSlice(d, 4 * row), 4);             // one sequence
  EXPECT_EQ(ChunkParallelSlice(d, 3 * row), 2);             // 3 rows fit: 2 + 2, not 3 + 1
  EXPECT_EQ(ChunkParallelSlice(d, 1), 1);                   // one row at least
  d.batch = 5;
  EXPECT_EQ(ChunkParallelSlice(d, 16 * row), 12);           // 4 fit: 3 + 2, not 4 + 1
}

struct Inputs {
  torch::Tensor x, y, v, w, documents;
};

// B sequences, 4 query heads on `rows` key rows, a trainable W (positive features: the
// closed-form backward gives dW).
Inputs MakeInputs(int64_t batch, int64_t rows, bool documents) {
  torch::manual_seed(11);
  const auto options = torch::TensorOptions().dtype(torch::kFloat64);
  Inputs in;
  in.x = torch::randn({batch, 4, kLength, kDim}, options);
  in.y = torch::randn({batch, rows, kLength, kDim}, options);
  in.v = torch::randn({batch, rows, kLength, kDim}, options);
  in.w = torch::randn({kFeatures, kDim}, options) * 0.5;
  if (documents) {  // a document boundary inside a chunk, one on a chunk's edge, one per row elsewhere
    in.documents = torch::zeros({batch, kLength}, torch::kLong);
    for (int64_t b = 0; b < batch; ++b) {
      in.documents[b].narrow(0, 7 + b, kLength - 7 - b).fill_(1);
      in.documents[b].narrow(0, 32, kLength - 32).fill_(2);
    }
  }
  return in;
}

FeatureMap Map(const torch::Tensor& w) {
  FeatureMap map;
  map.params = {w};
  map.positive_features = true;
  map.num_features = kFeatures;
  map.op = CausalOp::kChunkParallel;
  map.log_features = [](const torch::Tensor& x, const std::vector<torch::Tensor>& p, bool) {
    return LogPositiveFeatures(x, p[0].to(x.scalar_type()));
  };
  return map;
}

struct Result {
  std::vector<torch::Tensor> tensors;  // out, dx, dy, dv, dW
};

Result RunCall(const Inputs& in, int64_t slice_bytes) {
  const auto x = in.x.clone().requires_grad_(), y = in.y.clone().requires_grad_(), v = in.v.clone().requires_grad_();
  const auto w = in.w.clone().requires_grad_();
  const auto out = ChunkParallelCausalAttention(x, y, v, Map(w), kChunk, in.documents, slice_bytes);
  torch::manual_seed(5);
  (out * torch::randn_like(out)).sum().backward();
  return {{out.detach(), x.grad(), y.grad(), v.grad(), w.grad()}};
}

double RelativeError(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

TEST(ChunkParallelSlicesTest, SlicesComputeWhatTheWholeCallDoes) {
  const double unit_ratio = std::ldexp(1.0, -29);  // fp64's unit over fp32's
  const std::vector<std::string> names = {"out", "dx", "dy", "dv", "dW"};
  for (const int64_t rows : {2, 4}) {
    for (const bool documents : {false, true}) {
      const auto in = MakeInputs(3, rows, documents);
      const auto whole = RunCall(in, int64_t{1} << 62);
      const int64_t row = PerRow(Dims(3, 4, rows));
      for (const int64_t budget : {2 * rows * row, rows * row, row}) {
        const auto sliced = RunCall(in, budget);
        for (size_t i = 0; i < names.size(); ++i) {
          const double bound = 2 * (i == 0 ? 1e-4 : 1e-3) * unit_ratio;
          EXPECT_LE(RelativeError(sliced.tensors[i], whole.tensors[i]), bound)
              << names[i] << ", " << rows << " key rows, slices of " << ChunkParallelSlice(Dims(3, 4, rows), budget)
              << " rows" << (documents ? ", documents" : "");
        }
      }
    }
  }
}

// The backward's peak over what it held before it, fp32 (the dtype it is sized for), at proportions
// like Gemma 2B's (D = m, chunks of 64, four of them).
constexpr int64_t kPeakBatch = 2, kPeakLength = 256, kPeakWidth = 64, kPeakChunk = 64;

int64_t BackwardPeak(int64_t rows, int64_t slice_bytes) {
  torch::manual_seed(13);
  const auto x = torch::randn({kPeakBatch, 4, kPeakLength, kPeakWidth}).requires_grad_();
  const auto y = torch::randn({kPeakBatch, rows, kPeakLength, kPeakWidth}).requires_grad_();
  const auto v = torch::randn({kPeakBatch, rows, kPeakLength, kPeakWidth}).requires_grad_();
  const auto w = (torch::randn({kPeakWidth, kPeakWidth}) * 0.1).requires_grad_();
  const auto out = ChunkParallelCausalAttention(x, y, v, Map(w), kPeakChunk, {}, slice_bytes);
  const auto grad = torch::ones_like(out);
  auto info = std::make_shared<PeakMemory>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, info);
    torch::autograd::backward({out}, {grad});
  }
  return info->peak();
}

// The memory estimate's contract (docs/memory.md): within 15% of the measured peak. The backward
// peaks either in its slices (ChunkParallelWorkingBytes: the whole call's features and their
// gradients, and a slice's terms) or after them, in the features' backward, where what it returns
// (dx, dy, dv, dW in fp32) is made: the peak lies between the working set and the two together.
TEST(ChunkParallelSlicesTest, SlicesHoldLessAndTheEstimateSaysHowMuch) {
  for (const int64_t rows : {1, 4}) {
    const ChunkParallelDims d{kPeakBatch, kPeakLength, 4, rows, kPeakWidth, kPeakWidth, kPeakChunk};
    const int64_t returned = 4 * (kPeakBatch * kPeakLength * (4 + 2 * rows) * kPeakWidth + kPeakWidth * kPeakWidth);
    std::vector<int64_t> slices = {kPeakBatch * rows, rows};  // the whole call, a sequence, a row
    if (rows > 1) slices.push_back(1);
    int64_t last = 0;
    for (const int64_t slice_rows : slices) {
      const int64_t budget = slice_rows * PerRow(d);
      ASSERT_EQ(ChunkParallelSlice(d, budget), slice_rows);
      const int64_t peak = BackwardPeak(rows, budget);
      const double working = static_cast<double>(ChunkParallelWorkingBytes(d, slice_rows));
      const std::string where = std::to_string(rows) + " key rows, slices of " + std::to_string(slice_rows);
      EXPECT_GE(peak, working / 1.15) << where;
      EXPECT_LE(peak, 1.15 * (working + returned)) << where;
      if (last > 0) EXPECT_LT(peak, last) << where;
      last = peak;
    }
  }
}

}  // namespace
}  // namespace darkformer
