// The raw CPU kernel's sub-chunk pairs in factors (raw_cpu_pairs.h) against the pair exponentials
// they replace, 2^((a_ti + l_ji) - s_t) summed over features in fp64, with a running max that jumps
// by 200 inside the sub-chunk; and the kernel's subnormal flushing confined to its own calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attention/ops/fast_exp2.h"
#include "attention/ops/raw_cpu_kernel.h"
#include "attention/ops/raw_cpu_pairs.h"
#include "rounding_bounds.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace darkformer {
namespace {

using testing::Gamma;
using testing::ScaleChainError;
using namespace raw_cpu;

constexpr int64_t kSub = 8;  // positions in the sub-chunk

// One sub-chunk as the kernel sees it (base-2 logs): queries a, keys l, the entering reference,
// the running maxima R and the shifts s, in fp32 as the kernel computes them.
struct SubChunk {
  int64_t m;
  std::vector<float> a, l, ref, r, s;
};

SubChunk Make(int64_t m, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-40.0f, 40.0f);
  SubChunk c{m, std::vector<float>(kSub * m), std::vector<float>(kSub * m), std::vector<float>(m),
             std::vector<float>(kSub * m), std::vector<float>(kSub)};
  for (auto& x : c.a) x = u(gen);
  for (auto& x : c.l) x = u(gen);
  for (auto& x : c.ref) x = u(gen);
  for (int64_t i = 0; i < m; i += 3) c.l[3 * m + i] += 200.0f;  // the max jumps by 200 at key 3
  for (int64_t j = 0; j < kSub; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      const float prev = j > 0 ? c.r[(j - 1) * m + i] : c.ref[i];
      c.r[j * m + i] = std::max(prev, c.l[j * m + i]);
    }
  }
  for (int64_t t = 0; t < kSub; ++t) {
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < m; ++i) best = std::max(best, c.a[t * m + i] + c.r[t * m + i]);
    c.s[t] = best;
  }
  return c;
}

// The sub-chunk's factors as the kernel computes them (sl x m each): Q_t = 2^((a_t + R(t)) - s_t),
// K and the step decays.
struct Factors {
  std::vector<float> q, k, delta;
};

Factors FactorsOf(const SubChunk& c) {
  const int64_t m = c.m;
  Factors f{std::vector<float>(kSub * m), std::vector<float>(kSub * m), std::vector<float>(kSub * m)};
  for (int64_t t = 0; t < kSub; ++t) Exp2OfSum(&c.a[t * m], &c.r[t * m], c.s[t], &f.q[t * m], m);
  KeyFactors(c.l.data(), c.r.data(), c.ref.data(), true, kSub, m, f.k.data(), f.delta.data());
  return f;
}

// m: 37 runs the loops' tails too. The raw kernel runs only where its loops are vectorised.
class RawCpuPairs : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    if (!Exp2LoopsVectorised()) GTEST_SKIP() << "the raw kernel does not run on this CPU";
  }
};
INSTANTIATE_TEST_SUITE_P(Features, RawCpuPairs, ::testing::Values<int64_t>(37, 256));

TEST_P(RawCpuPairs, EveryPairWeightIsTheSumOfItsExponentials) {
  const int64_t m = GetParam();
  const SubChunk c = Make(m, 7);
  const auto [q, k, delta] = FactorsOf(c);
  for (int64_t t = 0; t < kSub; ++t) {
    std::vector<float> run(q.begin() + t * m, q.begin() + (t + 1) * m);
    for (int64_t j = t; j >= 0; --j) {
      const float w = DotThenScale(run.data(), &k[j * m], &delta[j * m], m);
      // Each term: 2 + (t - j) exponentials and as many products, whose rounded arguments are
      // a + R(t) and its shift by s, l - R(j), and the steps of R from j to t (summing to R(t) - R(j)).
      double exact = 0, bound = 0;
      for (int64_t i = 0; i < m; ++i) {
        const double a = c.a[t * m + i], rt = c.r[t * m + i], rj = c.r[j * m + i], l = c.l[j * m + i];
        const double term = std::exp2(a + l - c.s[t]);
        const double arguments = std::abs(a + rt) + std::abs(a + rt - c.s[t]) + std::abs(l - rj) + (rt - rj);
        exact += term;
        bound += term * ((1 + ScaleChainError(2.0 + (t - j), arguments)) * (1 + Gamma(m)) - 1);
      }
      // A factor below 2^-126 is flushed, and the term it belongs to is smaller still.
      EXPECT_LE(std::abs(w - exact), bound + m * 0x1p-126) << "t " << t << " j " << j << " exact " << exact;
    }
    // The running product, after the sub-chunk's first key: the state-read factor 2^((a_t + R(-1)) - s_t).
    for (int64_t i = 0; i < m; ++i) {
      const double a = c.a[t * m + i], rt = c.r[t * m + i], ref = c.ref[i];
      const double exact = std::exp2(a + ref - c.s[t]);
      const double arguments = std::abs(a + rt) + std::abs(a + rt - c.s[t]) + (rt - ref);
      EXPECT_LE(std::abs(run[i] - exact), exact * ScaleChainError(2.0 + t, arguments) + 0x1p-126) << t << " " << i;
    }
  }
}

TEST_P(RawCpuPairs, ThePairAttainingTheShiftIsExactlyOne) {
  const int64_t m = GetParam();
  const SubChunk c = Make(m, 11);
  const auto [q, k, delta] = FactorsOf(c);
  int attained = 0;
  for (int64_t t = 0; t < kSub; ++t) {
    int64_t star = 0;  // the feature attaining s_t, and the key in this sub-chunk holding R at it
    for (int64_t i = 0; i < m; ++i) {
      if (c.a[t * m + i] + c.r[t * m + i] == c.s[t]) star = i;
    }
    std::vector<float> run(q.begin() + t * m, q.begin() + (t + 1) * m);
    for (int64_t j = t; j >= 0; --j) {
      std::vector<float> da(m, 0.0f), dk(m, 0.0f);
      AccumulateThenScale(run.data(), &k[j * m], &delta[j * m], 1.0f, da.data(), dk.data(), m);
      if (c.l[j * m + star] == c.r[t * m + star]) {
        EXPECT_EQ(da[star], 1.0f) << "t " << t << " j " << j;
        EXPECT_EQ(dk[star], 1.0f);
        ++attained;
      }
    }
  }
  EXPECT_GT(attained, 0);  // the jump at key 3 holds the max for the later queries
}

TEST_P(RawCpuPairs, TheBackwardsPairMatchesTheForwardsAndItsGradients) {
  const int64_t m = GetParam();
  const SubChunk c = Make(m, 13);
  const auto [q, k, delta] = FactorsOf(c);
  const int64_t t = kSub - 1;
  std::vector<float> forward(q.begin() + t * m, q.begin() + (t + 1) * m), backward = forward;
  for (int64_t j = t; j >= 0; --j) {
    const std::vector<float> e_run = backward;
    std::vector<float> da(m, 0.5f), dk(m, -0.25f);
    const float weight = 3.0f;
    const float w_forward = DotThenScale(forward.data(), &k[j * m], &delta[j * m], m);
    const float w_backward = AccumulateThenScale(backward.data(), &k[j * m], &delta[j * m], weight, da.data(), dk.data(), m);
    double sum = 0;
    for (int64_t i = 0; i < m; ++i) {
      const double e = static_cast<double>(e_run[i]) * k[j * m + i];  // e_i, one rounding from exact
      sum += e;
      EXPECT_NEAR(da[i], 0.5 + weight * e, Gamma(3) * (0.5 + weight * e)) << j << " " << i;
      EXPECT_NEAR(dk[i], -0.25 + weight * e, Gamma(3) * (0.25 + weight * e)) << j << " " << i;
      EXPECT_EQ(backward[i], forward[i]);  // the same running product
    }
    EXPECT_NEAR(w_forward, sum, Gamma(m + 1) * sum + m * 0x1p-126) << j;
    EXPECT_NEAR(w_backward, sum, Gamma(m + 1) * sum + m * 0x1p-126) << j;
  }
}

TEST_P(RawCpuPairs, KeysAtTheEndAndTheStatesDecay) {
  const int64_t m = GetParam();
  const SubChunk c = Make(m, 17);
  const auto [q, k, delta] = FactorsOf(c);
  std::vector<float> at_end(kSub * m), decay(m);
  KeysAtEnd(k.data(), delta.data(), kSub, m, at_end.data(), decay.data());
  const float* end = &c.r[(kSub - 1) * m];
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < kSub; ++j) {
      const double l = c.l[j * m + i], rj = c.r[j * m + i];
      const double exact = std::exp2(l - end[i]);
      const double arguments = std::abs(l - rj) + (end[i] - rj);
      EXPECT_LE(std::abs(at_end[j * m + i] - exact), exact * ScaleChainError(1.0 + kSub - j, arguments) + 0x1p-126);
    }
    const double exact = std::exp2(static_cast<double>(c.ref[i]) - end[i]);
    EXPECT_LE(std::abs(decay[i] - exact), exact * ScaleChainError(kSub, end[i] - c.ref[i]) + 0x1p-126) << i;
  }
}

#if defined(__x86_64__) || defined(__i386__)
// The kernel flushes subnormal numbers to 0 while a row runs, and hands the thread's floating-point
// control word back as it found it.
TEST(RawCpuKernel, FlushesSubnormalsOnlyInsideItsOwnCalls) {
  if (!Exp2LoopsVectorised()) GTEST_SKIP() << "the raw kernel runs only where its loops are vectorised";
  const int64_t length = 16, dim = 4, dv = 3, m = 8, chunk = 8;
  std::mt19937 gen(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto random = [&](int64_t size) {
    std::vector<float> x(size);
    for (auto& value : x) value = n(gen);
    return x;
  };
  const std::vector<float> w = random(m * dim), x = random(length * dim), y = random(length * dim), v = random(length * dv);
  std::vector<float> w2(dim * m);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t d = 0; d < dim; ++d) w2[d * m + i] = w[i * dim + d] * 1.4426950408889634f;
  }
  const PositiveRow row{length, dim, dv, m, 1, chunk, w.data(), w2.data(), x.data(), length * dim, y.data(), v.data()};
  const int64_t count = CheckpointCount(length, m, chunk);
  std::vector<float> out(length * dv), den(length), states(count * m * (dv + 1)), refs(count * m);
  std::vector<float> g = random(length * dv), dx(length * dim), dy(length * dim), dvv(length * dv), dw(m * dim, 0.0f);
  const unsigned before = _mm_getcsr();
  RunPositiveRowForward(row, {out.data(), length * dv, den.data(), length, states.data(), refs.data()});
  EXPECT_EQ(_mm_getcsr(), before);
  RunPositiveRowBackward(row, {states.data(), refs.data(), out.data(), length * dv, den.data(), length, g.data(),
                               length * dv, dx.data(), length * dim, dy.data(), dvv.data(), dw.data()});
  EXPECT_EQ(_mm_getcsr(), before);
  volatile float tiny = 0x1p-126f;  // outside the kernel, subnormal results stay
  EXPECT_GT(tiny * 0.5f, 0.0f);
  for (const float d : den) EXPECT_GE(d, 1.0f);
}
#endif

}  // namespace
}  // namespace darkformer
