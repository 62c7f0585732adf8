// Fused base-2 exponentials for the fused operator's CPU path (see fast_exp2.h). On x86-64 CPUs
// with AVX2 and FMA (checked at run time) eight lanes at a time; elsewhere the same arithmetic
// one value at a time.
#include "attention/ops/fast_exp2.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DF_HAVE_AVX2_PATH 1
#include <immintrin.h>
#endif

namespace darkformer {

namespace {

// 2^f on [-1/2, 1/2]: coefficients of f^0 .. f^6, a least-squares fit of 2^f in relative error
// on Chebyshev nodes (max relative error 2e-9 in exact arithmetic, ~1e-7 evaluated in fp32).
constexpr float kC0 = 1.0000000005921685f, kC1 = 0.693147205605889f, kC2 = 0.24022646608042308f,
                kC3 = 0.055503289857482166f, kC4 = 0.009618519562716546f, kC5 = 0.0013399865142307461f,
                kC6 = 0.0001533758095714939f;
constexpr float kLowest = -126.0f, kHighest = 126.0f;

float Exp2(float x) {
  if (x != x) return x;  // NaN stays NaN
  if (x < kLowest) return 0.0f;
  const float xc = std::min(x, kHighest);
  // round(xc) + 127 by truncation of a positive number (xc + 127.5 >= 1.5): the biased exponent.
  const int32_t e = static_cast<int32_t>(xc + 127.5f);
  const float f = xc - static_cast<float>(e - 127);
  const float p = kC0 + f * (kC1 + f * (kC2 + f * (kC3 + f * (kC4 + f * (kC5 + f * kC6)))));
  const int32_t bits = e << 23;  // 2^(e - 127) as an fp32 bit pattern
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

#ifdef DF_HAVE_AVX2_PATH
#define DF_AVX2 __attribute__((target("avx2,fma")))

std::atomic<bool> force_scalar{false};

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has && !force_scalar.load(std::memory_order_relaxed);
}

// Exp2 above, eight lanes.
DF_AVX2 inline __m256 Exp2x8(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(kLowest);
  // max/min return their second operand for a NaN lane: xc is finite in every lane.
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lowest), _mm256_set1_ps(kHighest));
  const __m256i e = _mm256_cvttps_epi32(_mm256_add_ps(xc, _mm256_set1_ps(127.5f)));
  const __m256 f = _mm256_sub_ps(xc, _mm256_cvtepi32_ps(_mm256_sub_epi32(e, _mm256_set1_epi32(127))));
  __m256 p = _mm256_fmadd_ps(f, _mm256_set1_ps(kC6), _mm256_set1_ps(kC5));
  p = _mm256_fmadd_ps(f, p, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(f, p, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(f, p, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(f, p, _mm256_set1_ps(kC1));
  p = _mm256_fmadd_ps(f, p, _mm256_set1_ps(kC0));
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lowest, _CMP_LT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

DF_AVX2 void Exp2InPlaceAvx2(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, Exp2x8(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) x[i] = Exp2(x[i]);
}

// The fused passes (fast_exp2.h), eight lanes, the tail one value at a time.
DF_AVX2 float SumExp2OfSumAvx2(const float* a, const float* b, float shift, int64_t n) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    acc = _mm256_add_ps(acc, Exp2x8(_mm256_sub_ps(_mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)), s)));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < n; ++i) sum += Exp2((a[i] + b[i]) - shift);
  return sum;
}

DF_AVX2 float AccumulateExp2OfSumAvx2(const float* a, const float* b, float shift, float weight, float* da, float* db,
                                      int64_t n) {
  const __m256 s = _mm256_set1_ps(shift), w = _mm256_set1_ps(weight);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp2x8(_mm256_sub_ps(_mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)), s));
    acc = _mm256_add_ps(acc, e);
    _mm256_storeu_ps(da + i, _mm256_fmadd_ps(w, e, _mm256_loadu_ps(da + i)));
    _mm256_storeu_ps(db + i, _mm256_fmadd_ps(w, e, _mm256_loadu_ps(db + i)));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < n; ++i) {
    const float e = Exp2((a[i] + b[i]) - shift);
    sum += e;
    da[i] += weight * e;
    db[i] += weight * e;
  }
  return sum;
}

DF_AVX2 void Exp2OfSumAvx2(const float* a, const float* b, float shift, float* out, int64_t n) {
  const __m256 s = _mm256_set1_ps(shift);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, Exp2x8(_mm256_sub_ps(_mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)), s)));
  }
  for (; i < n; ++i) out[i] = Exp2((a[i] + b[i]) - shift);
}
#endif

}  // namespace

float SumExp2OfSum(const float* a, const float* b, float shift, int64_t n) {
#ifdef DF_HAVE_AVX2_PATH
  if (HasAvx2()) return SumExp2OfSumAvx2(a, b, shift, n);
#endif
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += Exp2((a[i] + b[i]) - shift);
  return sum;
}

float AccumulateExp2OfSum(const float* a, const float* b, float shift, float weight, float* da, float* db, int64_t n) {
#ifdef DF_HAVE_AVX2_PATH
  if (HasAvx2()) return AccumulateExp2OfSumAvx2(a, b, shift, weight, da, db, n);
#endif
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float e = Exp2((a[i] + b[i]) - shift);
    sum += e;
    da[i] += weight * e;
    db[i] += weight * e;
  }
  return sum;
}

void Exp2OfSum(const float* a, const float* b, float shift, float* out, int64_t n) {
#ifdef DF_HAVE_AVX2_PATH
  if (HasAvx2()) return Exp2OfSumAvx2(a, b, shift, out, n);
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = Exp2((a[i] + b[i]) - shift);
}

bool Exp2LoopsVectorised() {
#ifdef DF_HAVE_AVX2_PATH
  return HasAvx2();
#else
  return false;
#endif
}

void ForceScalarExp2ForTesting(bool scalar) {
#ifdef DF_HAVE_AVX2_PATH
  force_scalar = scalar;
#endif
}

void Exp2InPlace(float* x, int64_t n) {
#ifdef DF_HAVE_AVX2_PATH
  if (HasAvx2()) return Exp2InPlaceAvx2(x, n);
#endif
  for (int64_t i = 0; i < n; ++i) x[i] = Exp2(x[i]);
}

}  // namespace darkformer
