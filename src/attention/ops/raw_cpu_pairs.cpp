// The sub-chunk pairs in factors (see raw_cpu_pairs.h). The two pair loops are written in AVX2
// (the compiler does not vectorise a loop that updates one of its inputs in place; the kernel runs
// only where AVX2 is, raw_cpu_kernel.h), the tails and other CPUs one value at a time.
#include "attention/ops/raw_cpu_pairs.h"

#include <algorithm>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DF_PAIRS_AVX2 1
#include <immintrin.h>
#endif

#include "attention/ops/fast_exp2.h"
#include "attention/ops/raw_cpu_features.h"

namespace darkformer::raw_cpu {

DF_KERNEL_LOOPS void KeyFactors(const float* l2, const float* rrows, const float* ref, bool has, int64_t sl, int64_t m,
                                float* k, float* delta) {
  for (int64_t j = 0; j < sl; ++j) {
    const float* r = rrows + j * m;
    float* d = delta + j * m;
    if (j == 0 && !has) {
      std::fill(d, d + m, 0.0f);
    } else {
      const float* prev = j > 0 ? rrows + (j - 1) * m : ref;
      for (int64_t i = 0; i < m; ++i) d[i] = prev[i] - r[i];
    }
    const float* l = l2 + j * m;
    float* kj = k + j * m;
    for (int64_t i = 0; i < m; ++i) kj[i] = l[i] - r[i];
  }
  Exp2InPlace(k, sl * m);
  Exp2InPlace(delta, sl * m);
}

#ifdef DF_PAIRS_AVX2
// The horizontal sum of eight lanes, in the lane order the scalar tails below continue from.
DF_KERNEL_LOOPS inline float SumLanes(__m256 acc) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}
#endif

DF_KERNEL_LOOPS float DotThenScale(float* p, const float* k, const float* delta, int64_t m) {
  float sum = 0.0f;
  int64_t i = 0;
#ifdef DF_PAIRS_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= m; i += 8) {
    const __m256 pi = _mm256_loadu_ps(p + i);
    acc = _mm256_fmadd_ps(pi, _mm256_loadu_ps(k + i), acc);
    _mm256_storeu_ps(p + i, _mm256_mul_ps(pi, _mm256_loadu_ps(delta + i)));
  }
  sum = SumLanes(acc);
#endif
  for (; i < m; ++i) {
    sum += p[i] * k[i];
    p[i] *= delta[i];
  }
  return sum;
}

DF_KERNEL_LOOPS float AccumulateThenScale(float* p, const float* k, const float* delta, float weight, float* da,
                                          float* dk, int64_t m) {
  float sum = 0.0f;
  int64_t i = 0;
#ifdef DF_PAIRS_AVX2
  const __m256 w = _mm256_set1_ps(weight);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= m; i += 8) {
    const __m256 pi = _mm256_loadu_ps(p + i);
    const __m256 e = _mm256_mul_ps(pi, _mm256_loadu_ps(k + i));
    acc = _mm256_add_ps(acc, e);
    _mm256_storeu_ps(da + i, _mm256_fmadd_ps(w, e, _mm256_loadu_ps(da + i)));
    _mm256_storeu_ps(dk + i, _mm256_fmadd_ps(w, e, _mm256_loadu_ps(dk + i)));
    _mm256_storeu_ps(p + i, _mm256_mul_ps(pi, _mm256_loadu_ps(delta + i)));
  }
  sum = SumLanes(acc);
#endif
  for (; i < m; ++i) {
    const float e = p[i] * k[i];
    sum += e;
    da[i] += weight * e;
    dk[i] += weight * e;
    p[i] *= delta[i];
  }
  return sum;
}

DF_KERNEL_LOOPS void KeysAtEnd(const float* k, const float* delta, int64_t sl, int64_t m, float* keys_at_end,
                               float* decay) {
  std::fill(decay, decay + m, 1.0f);
  for (int64_t j = sl - 1; j >= 0; --j) {
    const float* kj = k + j * m;
    const float* d = delta + j * m;
    float* out = keys_at_end + j * m;
    for (int64_t i = 0; i < m; ++i) {
      out[i] = kj[i] * decay[i];
      decay[i] *= d[i];
    }
  }
}

DF_KERNEL_LOOPS void StateReadFromQ(const float* q, const float* delta, int64_t sl, int64_t m, float* out,
                                    float* running) {
  std::copy(delta, delta + m, running);
  for (int64_t t = 0; t < sl; ++t) {
    const float* d = delta + t * m;
    if (t > 0) {
      for (int64_t i = 0; i < m; ++i) running[i] *= d[i];
    }
    const float* qt = q + t * m;
    float* o = out + t * m;
    for (int64_t i = 0; i < m; ++i) o[i] = qt[i] * running[i];
  }
}

}  // namespace darkformer::raw_cpu
