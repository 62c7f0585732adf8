// The chunk-parallel form's sums over chunks (ops/chunk_decays.h), directly and in blocks of
// chunks, against their definition summed term by term in fp64: the states entering the chunks
// and the reverse states, with and without documents, at every block size from 1 to past the
// row (a padded last block, rows shorter than a block), and their memory per feature. The form on
// rows long enough to take the blocks: tests/cuda/device_chunk_parallel_test.cpp, on the test device.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention/ops/chunk_decays.h"

namespace darkformer {
namespace {

using causal_ops::ChunkDecays;

constexpr int64_t kFeatures = 3, kValues = 4;

struct Row {
  torch::Tensor end_BRMN, doc_B1N, u_BRMNV, t_BRMNV;  // fp64, one batch row and key row
};

// R(e_c) a running max inside each document (it restarts lower at a start), documents of 1 to 9
// chunks when `documents`, and own states of both signs.
Row MakeRow(int64_t chunks, bool documents, int64_t seed) {
  torch::manual_seed(seed);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  std::vector<int64_t> ids(chunks, 0);
  for (int64_t c = 1; c < chunks; ++c) ids[c] = ids[c - 1] + (documents && torch::rand({1}).item<double>() < 0.2);
  auto end = torch::empty({1, 1, kFeatures, chunks}, f64);
  for (int64_t i = 0; i < kFeatures; ++i) {
    double running = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const bool restart = c == 0 || ids[c] != ids[c - 1];
      running = restart ? 4 * torch::randn({1}).item<double>() : running + 2 * torch::rand({1}).item<double>();
      end[0][0][i][c] = running;
    }
  }
  Row r;
  r.end_BRMN = end;
  if (documents) r.doc_B1N = torch::tensor(ids).view({1, 1, chunks});
  r.u_BRMNV = torch::randn({1, 1, kFeatures, chunks, kValues}, f64);
  r.t_BRMNV = torch::randn({1, 1, kFeatures, chunks, kValues}, f64);
  return r;
}

// The definitions, term by term, and each output's sum of |terms| (the bound's magnitude).
struct Sums {
  torch::Tensor value, magnitude;
};
Sums Definition(const Row& r, bool reverse) {
  const int64_t n = r.end_BRMN.size(-1);
  auto value = torch::zeros_like(r.u_BRMNV), magnitude = torch::zeros_like(r.u_BRMNV);
  const auto end = r.end_BRMN[0][0];
  auto doc = [&](int64_t c) { return r.doc_B1N.defined() ? r.doc_B1N[0][0][c].item<int64_t>() : 0; };
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t c2 = 0; c2 < n; ++c2) {
      // Entering: c' < c, from R(e_c') to R(e_{c-1}); reverse: c' > c, from R(e_c) to R(e_{c'-1}).
      if (reverse ? !(c2 > c && doc(c) == doc(c2 - 1)) : !(c2 < c && doc(c2) == doc(c - 1))) continue;
      const auto factor = reverse ? (end.select(1, c) - end.select(1, c2 - 1)).exp()
                                  : (end.select(1, c2) - end.select(1, c - 1)).exp();
      const auto term = factor.unsqueeze(-1) * (reverse ? r.t_BRMNV : r.u_BRMNV)[0][0].select(1, c2);
      value[0][0].select(1, c) += term;
      magnitude[0][0].select(1, c) += term.abs();
    }
  }
  return {value, magnitude};
}

// fp64: each term's factor exp(x) carries its argument's rounding (|x| <= 2 max|R|, relative
// 2^-53 each side) and exp's own (a few ulps); the sum of n terms at most n roundings, the blocks'
// two levels and their shares a few more products and sums. So |got - sum| <= (2 max|R| + n + 16)
// 2^-52 sum |terms|.
void ExpectWithinBound(const torch::Tensor& got, const Sums& want, const Row& r, const std::string& where) {
  const double max_r = r.end_BRMN.abs().max().item<double>();
  const int64_t n = r.end_BRMN.size(-1);
  const auto bound = want.magnitude * ((2 * max_r + n + 16) * std::ldexp(1.0, -52));
  ASSERT_EQ(got.sizes(), want.value.sizes()) << where;
  EXPECT_TRUE(((got - want.value).abs() <= bound).all().item<bool>())
      << where << ": max error " << (got - want.value).abs().max().item<double>() << ", bound at it "
      << bound.flatten()[(got - want.value).abs().flatten().argmax()].item<double>();
}

TEST(ChunkDecaysTest, BothFormsAreTheDefinitionAtEveryBlockSize) {
  for (const int64_t chunks : {1, 2, 7, 30, 70}) {
    for (const bool documents : {false, true}) {
      const auto r = MakeRow(chunks, documents, 7 * chunks + documents);
      const auto entering = Definition(r, false), reverse = Definition(r, true);
      for (const int64_t block : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{9}, chunks + 1}) {
        const std::string where = "N " + std::to_string(chunks) + (documents ? " with documents" : "") + ", block " +
                                  std::to_string(block);
        const ChunkDecays d = causal_ops::MakeChunkDecays(r.end_BRMN, r.doc_B1N, block);
        // Chunk-major, as the form reads them.
        ExpectWithinBound(causal_ops::EnteringStates(d, r.u_BRMNV).transpose(2, 3), entering, r, where + " entering");
        ExpectWithinBound(causal_ops::ReverseStates(d, r.t_BRMNV).transpose(2, 3), reverse, r, where + " reverse");
      }
    }
  }
}

// Rows of up to 64 chunks keep the direct form; longer ones take blocks of ceil(sqrt(N)), whose
// decays are about 2 N^1.5 floats per feature where the direct form's are N^2.
TEST(ChunkDecaysTest, LongRowsTakeBlocksOfTheSquareRoot) {
  EXPECT_EQ(causal_ops::DecayBlockChunks(64), 0);
  EXPECT_EQ(causal_ops::DecayBlockChunks(65), 9);
  EXPECT_EQ(causal_ops::DecayBlockChunks(512), 23);
  EXPECT_EQ(causal_ops::DecayFloatsPerFeature(64), 64 * 64);
  for (const int64_t chunks : {65, 512, 4096}) {
    const auto r = MakeRow(chunks, true, 3);
    const ChunkDecays d = causal_ops::MakeChunkDecays(r.end_BRMN, r.doc_B1N);
    const int64_t b = causal_ops::DecayBlockChunks(chunks), blocks = chunks / b + 1;
    ASSERT_EQ(d.block, b);
    // What the decays hold (the padded R and the local decays) and the carries a sum makes.
    EXPECT_EQ((d.end_BRMKB.numel() + d.local_BRMKBB.numel()) / kFeatures + (blocks - 1) * (blocks - 1),
              causal_ops::DecayFloatsPerFeature(chunks));
    EXPECT_LT(causal_ops::DecayFloatsPerFeature(chunks), 3 * std::pow(chunks, 1.5)) << chunks;
  }
}

}  // namespace
}  // namespace darkformer
