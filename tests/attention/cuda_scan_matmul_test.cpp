// op: cuda's matrix products (ops/cuda_scan_matmul.h) as the host emulation runs them: the
// tensor-core path walks panels of kPanelRows x kPanelCols outputs, kPanelDepth deep per staged
// step, and its tiles and offsets are the device's. Shapes here cross every panel edge in every
// direction (several panels each way, ragged last ones, a depth that ends inside a WMMA step, a
// column or a few past the last whole panel, which one thread each sums: ThreadTailCols),
// through strided operands and an epilogue that reads what it writes over, as the scan's are; in
// both splits (Split::kTf32, the projections'; Split::kBf16, every other product's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <c10/util/BFloat16.h>

#include "attention/ops/cuda_scan_matmul.h"
#include "attention/ops/cuda_scan_threads.h"

namespace darkformer {
namespace {

using cuda_scan::Block;
using cuda_scan::kPanelCols;
using cuda_scan::kPanelDepth;
using cuda_scan::kPanelRows;
using cuda_scan::Major;
using cuda_scan::MatMul;
using cuda_scan::Split;
using cuda_scan::SplitProduct;

constexpr Split kSplits[] = {Split::kTf32, Split::kBf16};
const char* Name(Split split) { return split == Split::kTf32 ? "3xTF32" : "bf16x3"; }
float Product(Split split, float a, float b) {
  return split == Split::kTf32 ? SplitProduct<Split::kTf32>(a, b) : SplitProduct<Split::kBf16>(a, b);
}

struct Shape {
  int64_t rows, cols, depth;
};

// Shapes around the panels: one short tile, exact panels, one past them, several ragged ones.
std::vector<Shape> Shapes() {
  return {{1, 1, 1},
          {5, 17, 3},
          {kPanelRows, kPanelCols, kPanelDepth},
          {kPanelRows + 1, kPanelCols + 1, kPanelDepth + 1},
          {3 * kPanelRows - 7, 257, 5 * kPanelDepth - 3},  // Dv + 1 = 257 columns: whole panels and a tail
          {kPanelRows / 2 + 3, 3 * kPanelCols - 5, 4},
          // A state read: G S rows, m = 256 deep, the tail's depth split between threads (TailParts):
          // 32 runs at G S = 8, 4 at 64; 30 outputs of a 37-deep tail, 5 runs, the last short.
          {8, 257, 256},
          {64, 257, 256},
          {5, kPanelCols + 6, 37}};
}

// A (rows x depth) read transposed from a (depth x rows) buffer, B (depth x cols) at a row
// stride wider than cols: the scan's operands are rarely plain row-major.
struct Operands {
  int64_t rows, cols, depth, b_stride;
  std::vector<float> at, b;
};

Operands Make(const Shape& s, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Operands o{s.rows, s.cols, s.depth, s.cols + 3, {}, {}};
  o.at.resize(s.depth * s.rows);
  o.b.resize(s.depth * o.b_stride);
  for (auto& x : o.at) x = normal(gen);
  for (auto& x : o.b) x = normal(gen);
  return o;
}

// How the block stages the operands (Major: A's order, B's), every pairing; the sums must not
// depend on it, only where each element lands in the panels.
struct Order {
  Major a, b;
};
constexpr Order kOrders[] = {{Major::kRow, Major::kRow}, {Major::kCol, Major::kRow}, {Major::kRow, Major::kCol},
                             {Major::kCol, Major::kCol}};
const char* Name(Order order) {
  static const char* names[] = {"row/row", "col/row", "row/col", "col/col"};
  return names[(order.a == Major::kCol ? 1 : 0) + (order.b == Major::kCol ? 2 : 0)];
}

template <Split kSplit, Major kA, Major kB, typename Out>
void StagedProduct(const Operands& o, Out out) {
  auto a = [&](int64_t r, int64_t k) { return o.at[k * o.rows + r]; };
  auto b = [&](int64_t k, int64_t c) { return o.b[k * o.b_stride + c]; };
  // One thread, or the device's where a test sets the host's order (cuda_scan_threads.h).
  cuda_scan::RunHostBlock(cuda_scan::kThreads, [&](const Block& blk) {
    MatMul<kSplit, kA, kB>(blk, /*tensor_cores=*/true, o.rows, o.cols, o.depth, a, b, out);
  });
}

template <Split kSplit, typename Out>
void ProductStaged(Order order, const Operands& o, Out out) {
  if (order.a == Major::kRow && order.b == Major::kRow) StagedProduct<kSplit, Major::kRow, Major::kRow>(o, out);
  if (order.a == Major::kCol && order.b == Major::kRow) StagedProduct<kSplit, Major::kCol, Major::kRow>(o, out);
  if (order.a == Major::kRow && order.b == Major::kCol) StagedProduct<kSplit, Major::kRow, Major::kCol>(o, out);
  if (order.a == Major::kCol && order.b == Major::kCol) StagedProduct<kSplit, Major::kCol, Major::kCol>(o, out);
}

// The operands' product on the emulated tensor-core path, staged in `order`, each output to `out`.
template <typename Out>
void TensorCoreProduct(Split split, const Operands& o, Out out, Order order = kOrders[0]) {
  if (split == Split::kTf32) {
    ProductStaged<Split::kTf32>(order, o, out);
  } else {
    ProductStaged<Split::kBf16>(order, o, out);
  }
}

// The emulation's contract (cuda_scan_matmul.h): each output is sum_k SplitProduct(a, b) in order
// of k; past the last whole panel (ThreadTailCols) the depth in TailParts runs of TailRun, each
// summed so, the runs' sums then added in order.
float Want(Split split, const Operands& o, int64_t r, int64_t c) {
  const int64_t tail = cuda_scan::ThreadTailCols(o.cols);
  const bool in_tail = c >= o.cols - tail;
  const int64_t parts = in_tail ? cuda_scan::TailParts(o.rows * tail, o.depth) : 1;
  const int64_t run = parts > 1 ? cuda_scan::TailRun(o.depth, parts) : o.depth;
  float want = 0.0f;
  for (int64_t first = 0; first < o.depth; first += run) {
    float part = 0.0f;
    for (int64_t k = first; k < std::min(o.depth, first + run); ++k) {
      part += Product(split, o.at[k * o.rows + r], o.b[k * o.b_stride + c]);
    }
    want = parts > 1 ? want + part : part;
  }
  return want;
}

// Each output of every shape, split and staging order against Want, bit for bit: the mismatches.
int64_t Mismatches() {
  int64_t total = 0;
  for (const Split split : kSplits) {
    for (const Order order : kOrders) {
      uint32_t seed = 1;
      for (const auto& s : Shapes()) {
        const auto o = Make(s, seed++);
        std::vector<float> got(s.rows * s.cols, NAN);
        TensorCoreProduct(
            split, o, [&](int64_t r, int64_t c, float sum) { got[r * s.cols + c] = sum; }, order);
        int64_t mismatches = 0;
        for (int64_t r = 0; r < s.rows; ++r) {
          for (int64_t c = 0; c < s.cols; ++c) mismatches += got[r * s.cols + c] != Want(split, o, r, c);  // NaN too
        }
        EXPECT_EQ(mismatches, 0) << Name(split) << " " << Name(order) << " " << s.rows << " x " << s.cols << " x "
                                 << s.depth;
        total += mismatches;
      }
    }
  }
  return total;
}

TEST(CudaScanMatMulTest, PanelsGiveTheInOrderSplitSumsToTheBit) {
  // Whatever the panels and the order they are staged in (an element put where the tiles do not
  // read it fails this), the sums of the contract above, bit for bit.
  EXPECT_EQ(Mismatches(), 0);
}

TEST(CudaScanMatMulTest, TheDevicesThreadsGiveTheSameSumsInEitherOrder) {
  // The block's 256 threads as the device splits the products between them (each warp its tiles,
  // the tails' runs one thread each), in order of tid and reversed: the same bits (a missing
  // barrier between staging, sums, runs and emits reads otherwise in one of the orders).
  const auto was = cuda_scan::HostThreadOrderNow();
  for (const bool reversed : {false, true}) {
    cuda_scan::SetHostThreadOrderForTesting({/*device_threads=*/true, reversed});
    EXPECT_EQ(Mismatches(), 0) << (reversed ? "reversed" : "in order");
  }
  cuda_scan::SetHostThreadOrderForTesting(was);
}

TEST(CudaScanMatMulTest, TensorCoreSumsStayWithinTheirBoundOfTheFp64Product) {
  // Against fp64. One 3xTF32 product: hi = TF32(x) is within 2^-11 |x| of x and lo = TF32(x - hi)
  // within 2^-11 of the rest, so hi + lo = x (1 + d), |d| <= 2^-22, for a and b; dropping
  // a_lo b_lo costs <= 2^-22 |a b|; the three partial products (11 x 11 bits) are exact in fp32
  // and their two sums round by <= 2^-24 each: <= 4 2^-22 |a b| in all. One bf16x3 product, the
  // same with 8-bit halves: hi + lo = x (1 + d), |d| <= 2^-9 2^-9 = 2^-18, so (1 + d_a)(1 + d_b)
  // is within 2^-17 + 2^-36 of 1; a_lo b_lo <= (2^-9 + 2^-18)^2 |a b| < 2^-18 (1 + 2^-8) |a b|;
  // the partial products (8 x 8 bits) are exact and the two sums round by <= 2^-24 each: under
  // 3.1 2^-18 |a b|, so <= 4 2^-18 |a b|. The fp32 sum of `depth` such terms adds <= depth 2^-24
  // (1 + 2^-10) sum_k |a_k b_k| (the factor covers the terms' own excess over |a_k b_k| and
  // gamma_n's denominator at n <= 317).
  for (const Split split : kSplits) {
    const double per_term = split == Split::kTf32 ? 4 * std::ldexp(1.0, -22) : 4 * std::ldexp(1.0, -18);
    uint32_t seed = 100;
    for (const auto& s : Shapes()) {
      const auto o = Make(s, seed++);
      std::vector<float> got(s.rows * s.cols);
      TensorCoreProduct(split, o, [&](int64_t r, int64_t c, float sum) { got[r * s.cols + c] = sum; });
      double worst = 0.0;
      for (int64_t r = 0; r < s.rows; ++r) {
        for (int64_t c = 0; c < s.cols; ++c) {
          double exact = 0.0, magnitude = 0.0;
          for (int64_t k = 0; k < s.depth; ++k) {
            const double p = double(o.at[k * s.rows + r]) * double(o.b[k * o.b_stride + c]);
            exact += p;
            magnitude += std::fabs(p);
          }
          const double bound = (per_term + s.depth * std::ldexp(1.0, -24) * (1 + std::ldexp(1.0, -10))) * magnitude;
          worst = std::max(worst, std::fabs(got[r * s.cols + c] - exact) / bound);
        }
      }
      EXPECT_LE(worst, 1.0) << Name(split) << " " << s.rows << " x " << s.cols << " x " << s.depth;
    }
  }
}

// Each product's halves as the device forms them: hi is x rounded to bf16 as LibTorch rounds it
// (c10::BFloat16, to nearest even) and lo the rest rounded likewise, so the three partial
// products are exact in fp32; x's whose bf16 rounding is a tie, or lands on a power of two, or
// carries into the exponent, among them.
TEST(CudaScanMatMulTest, Bf16HalvesAreLibTorchsRounding) {
  std::mt19937 gen(5);
  std::uniform_int_distribution<uint32_t> bits(0u, 0xffffffffu);
  std::vector<float> xs = {1.0f, -1.0f, 1.00390625f /* a tie: 1 + 2^-8 */, 1.01171875f, 0.99999994f, 3.0e-39f,
                           -2.5e38f, 1.5f * std::ldexp(1.0f, -126)};
  for (int i = 0; i < 20000; ++i) {
    float x;
    const uint32_t u = bits(gen) & 0x7f7fffffu;  // finite, either sign below
    std::memcpy(&x, &u, sizeof x);
    xs.push_back(i % 2 ? -x : x);
  }
  int64_t mismatches = 0;
  for (const float x : xs) {
    const float hi = cuda_scan::RoundToBf16(x);
    const float lo = cuda_scan::RoundToBf16(x - hi);
    mismatches += hi != static_cast<float>(c10::BFloat16(x));
    mismatches += lo != static_cast<float>(c10::BFloat16(x - hi));
    // 8 significant bits each: their product is exact in fp32 (no rounding to find).
    const double exact = double(hi) * double(lo);
    const bool normal = std::fabs(exact) > 1e-30 && std::fabs(exact) < 1e30;  // fp32's range, no subnormal
    mismatches += normal && double(hi * lo) != exact;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(CudaScanMatMulTest, EpilogueMayReadTheOutputItWrites) {
  // As the fold's `state = decay state + sum`: each output's epilogue runs once, after its sum.
  const Shape s{2 * kPanelRows + 5, kPanelCols + 9, 2 * kPanelDepth + 1};
  const auto o = Make(s, 7);
  std::vector<float> initial(s.rows * s.cols), want(s.rows * s.cols);
  for (int64_t i = 0; i < s.rows * s.cols; ++i) initial[i] = static_cast<float>(i % 97) - 48.0f;
  auto state = initial;
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t c = 0; c < s.cols; ++c) {
      float sum = 0.0f;
      for (int64_t k = 0; k < s.depth; ++k) sum += Product(Split::kBf16, o.at[k * s.rows + r], o.b[k * o.b_stride + c]);
      want[r * s.cols + c] = 0.5f * initial[r * s.cols + c] + sum;
    }
  }
  TensorCoreProduct(Split::kBf16, o, [&](int64_t r, int64_t c, float sum) {
    state[r * s.cols + c] = 0.5f * state[r * s.cols + c] + sum;
  });
  EXPECT_EQ(state, want);
  // The same as an InPlace epilogue (its reads batched before its writes), in every staging order.
  for (const Order order : kOrders) {
    state = initial;
    TensorCoreProduct(
        Split::kBf16, o,
        cuda_scan::Updating([&](int64_t r, int64_t c) { return state.data() + r * s.cols + c; },
                            [](int64_t, int64_t, float old, float sum) { return 0.5f * old + sum; }),
        order);
    EXPECT_EQ(state, want) << Name(order);
  }
}

// EmitTile's InPlace epilogue as a warp runs it, lane after lane, on a tile cut by the product's
// edges: every output inside them read once and then written once, with combine(old, sum); none
// outside touched.
TEST(CudaScanMatMulTest, InPlaceEpilogueReadsEachOutputBeforeItsOnlyWrite) {
  for (const bool reads_old : {true, false}) {
    std::vector<float> pc(256);
    for (int e = 0; e < 256; ++e) pc[e] = static_cast<float>(e);
    const int64_t rows = 16 + 11, cols = 16 + 5, r0 = 0, c0 = 0;
    const int tile = cuda_scan::kPanelCols / 16 + 1;  // second tile row, second tile column: rows 16-31, cols 16-31
    std::vector<float> out(rows * cols), before(rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i) out[i] = before[i] = 1000.0f + static_cast<float>(i);
    std::vector<int> reads(rows * cols, 0), writes(rows * cols, 0);
    for (int lane = 0; lane < 32; ++lane) {
      auto at = [&](int64_t r, int64_t c) {
        ++reads[r * cols + c];  // a write goes through at() too: counted below
        return out.data() + r * cols + c;
      };
      auto combine = [&](int64_t r, int64_t c, float old, float sum) {
        EXPECT_EQ(writes[r * cols + c], 0) << "output " << r << ", " << c << " combined twice";
        ++writes[r * cols + c];
        return old + sum;
      };
      cuda_scan::EmitTile(pc.data(), rows, cols, r0, c0, tile, lane, 32, cuda_scan::Updating(at, combine, reads_old));
    }
    // Without reads (a fold into a state not yet made), combine gets 0 for old and at() is called
    // for the write's address alone.
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const bool inside = r >= 16 && c >= 16;
        EXPECT_EQ(writes[r * cols + c], inside ? 1 : 0) << r << ", " << c;
        EXPECT_EQ(reads[r * cols + c], inside ? (reads_old ? 2 : 1) : 0) << r << ", " << c;
        const float old = before[r * cols + c];
        EXPECT_EQ(out[r * cols + c], inside ? (reads_old ? old : 0.0f) + pc[(r - 16) * 16 + (c - 16)] : old)
            << r << ", " << c;
      }
    }
  }
}


// BatchedPuts (ops/cuda_scan_block.h) as the device's blocks run it: kThreads threads, each issuing
// kStageBatch gets before its puts. Every element is put once, with its own get, by the thread the
// block's stride gives it, at sizes that end inside a batch and a panel's (the staging's), and no
// thread puts before it has got its whole batch.
TEST(CudaScanMatMulTest, BatchedPutsPutEachElementOnceOnEveryThreadCount) {
  using cuda_scan::BatchedPuts;
  using cuda_scan::kStageBatch;
  for (const int threads : {1, 32, cuda_scan::kThreads}) {
    for (const int64_t n : {int64_t{1}, int64_t{255}, int64_t{257}, int64_t{kPanelRows * kPanelDepth},
                            int64_t{8 * 257 + 3}}) {
      std::vector<int> puts(n, 0), by(n, -1);
      for (int tid = 0; tid < threads; ++tid) {
        const Block block{tid, threads};
        int got = 0, put = 0;
        BatchedPuts(
            block, n,
            [&](int64_t i) {
              EXPECT_EQ(put % kStageBatch, 0) << "a get after a put inside one batch";
              ++got;
              return static_cast<float>(i);
            },
            [&](int64_t i, float x) {
              ++put;
              EXPECT_LE(put, got);
              EXPECT_EQ(x, static_cast<float>(i)) << "element " << i << " put another's value";
              ++puts[i];
              by[i] = tid;
            });
        EXPECT_EQ(got, put);
      }
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(puts[i], 1) << "element " << i << " of " << n << " at " << threads << " threads";
        EXPECT_EQ(by[i], i % threads) << "element " << i << ": consecutive threads take consecutive elements";
      }
    }
  }
}

}  // namespace
}  // namespace darkformer
