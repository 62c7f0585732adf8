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

DF_AVX2 void ShiftExp2RowsAvx2(float* x, int64_t rows, int64_t cols, float* max_out) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    __m256 lanes = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) lanes = _mm256_max_ps(lanes, _mm256_loadu_ps(row + c));
    float lane[8];
    _mm256_storeu_ps(lane, lanes);
    float row_max = *std::max_element(lane, lane + 8);
    for (; c < cols; ++c) row_max = std::max(row_max, row[c]);
    const __m256 shift = _mm256_set1_ps(row_max);
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8) _mm256_storeu_ps(row + j, Exp2x8(_mm256_sub_ps(_mm256_loadu_ps(row + j), shift)));
    for (; j < cols; ++j) row[j] = Exp2(row[j] - row_max);
    max_out[r] = row_max;
  }
}

// MulCausalWeights (below) in one AVX2 function: no scalar code between its vector loops. Each
// query i computes weights for the vectors that hold keys 0..i (lanes past i are 0 by a blend,
// as are NaN products there), then scales every row of every block.
DF_AVX2 void MulCausalWeightsAvx2(float* const* blocks, int count, int64_t rows, int64_t group, int64_t c,
                                  const float* b, int64_t b_row_stride, const float* ref, int64_t ref_row_stride,
                                  float* w) {
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 zero = _mm256_setzero_ps();
  const int64_t full = c / 8 * 8;
  for (int64_t r = 0; r < rows; ++r) {
    const float* b_row = b + r * b_row_stride;
    for (int64_t i = 0; i < c; ++i) {
      const float ref_i = ref[r * ref_row_stride + i];
      const __m256 ref_v = _mm256_set1_ps(ref_i);
      const __m256 last = _mm256_set1_ps(static_cast<float>(i));
      const int64_t covered = std::min(full, (i / 8 + 1) * 8);  // vectors holding keys <= i
      for (int64_t j = 0; j < covered; j += 8) {
        const __m256 keep = _mm256_cmp_ps(_mm256_add_ps(lane, _mm256_set1_ps(static_cast<float>(j))), last, _CMP_LE_OQ);
        const __m256 wj = Exp2x8(_mm256_sub_ps(_mm256_loadu_ps(b_row + j), ref_v));
        _mm256_storeu_ps(w + j, _mm256_blendv_ps(zero, wj, keep));
      }
      for (int64_t j = full; j < c; ++j) w[j] = j <= i ? Exp2(b_row[j] - ref_i) : 0.0f;
      for (int n = 0; n < count; ++n) {
        for (int64_t g = 0; g < group; ++g) {
          float* out = blocks[n] + ((r * group + g) * c + i) * c;
          int64_t j = 0;
          for (; j < covered; j += 8) {
            const __m256 keep = _mm256_cmp_ps(_mm256_add_ps(lane, _mm256_set1_ps(static_cast<float>(j))), last, _CMP_LE_OQ);
            const __m256 product = _mm256_mul_ps(_mm256_loadu_ps(out + j), _mm256_loadu_ps(w + j));
            _mm256_storeu_ps(out + j, _mm256_blendv_ps(zero, product, keep));
          }
          for (; j < full; j += 8) _mm256_storeu_ps(out + j, zero);
          for (; j < c; ++j) out[j] = j <= i ? out[j] * w[j] : 0.0f;
        }
      }
    }
  }
}
#endif

}  // namespace

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

void ShiftExp2Rows(float* x, int64_t rows, int64_t cols, float* max_out) {
#ifdef DF_HAVE_AVX2_PATH
  if (HasAvx2()) return ShiftExp2RowsAvx2(x, rows, cols, max_out);
#endif
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    const float row_max = *std::max_element(row, row + cols);
    for (int64_t j = 0; j < cols; ++j) row[j] = Exp2(row[j] - row_max);
    max_out[r] = row_max;
  }
}

void MulCausalWeights(float* const* blocks, int count, int64_t rows, int64_t group, int64_t c, const float* b,
                      int64_t b_row_stride, const float* ref, int64_t ref_row_stride) {
  std::vector<float> weights(static_cast<size_t>(c));
  float* w = weights.data();
#ifdef DF_HAVE_AVX2_PATH
  if (HasAvx2()) {
    return MulCausalWeightsAvx2(blocks, count, rows, group, c, b, b_row_stride, ref, ref_row_stride, w);
  }
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const float* b_row = b + r * b_row_stride;
    for (int64_t i = 0; i < c; ++i) {
      const float ref_i = ref[r * ref_row_stride + i];
      for (int64_t j = 0; j <= i; ++j) w[j] = Exp2(b_row[j] - ref_i);
      for (int n = 0; n < count; ++n) {
        for (int64_t g = 0; g < group; ++g) {
          float* out = blocks[n] + ((r * group + g) * c + i) * c;
          for (int64_t j = 0; j <= i; ++j) out[j] *= w[j];
          // Later keys are set to 0, not multiplied by 0: a non-finite q.k of a later key stays out.
          std::fill(out + i + 1, out + c, 0.0f);
        }
      }
    }
  }
}

}  // namespace darkformer
