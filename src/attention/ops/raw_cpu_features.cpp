// The raw CPU kernel's features (see raw_cpu_features.h).
#include "attention/ops/raw_cpu_features.h"

#include <algorithm>

#include "attention/ops/cpu_gemm.h"

namespace darkformer::raw_cpu {

namespace {
constexpr double kLog2E = 1.4426950408889634;
}  // namespace

// sum_k a[k] b[k] and sum_k a[k] in eight independent partial sums (a vector register's lanes;
// one running sum is a chain of dependent adds the compiler may not reorder).
DF_KERNEL_LOOPS float Dot(const float* a, const float* b, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += a[k + l] * b[k + l];
  }
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; k < n; ++k) sum += a[k] * b[k];
  return sum;
}
DF_KERNEL_LOOPS float Sum(const float* a, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += a[k + l];
  }
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; k < n; ++k) sum += a[k];
  return sum;
}

void QueryLog2(const PositiveRow& p, int64_t start, int64_t rows, float* out) {
  for (int64_t h = 0; h < p.group; ++h) {
    GemmRowMajor(false, false, rows, p.features, p.dim, 1.0f, p.x + h * p.x_head_stride + start * p.dim, p.dim,
                 p.w2_DM, p.features, 0.0f, out + h * rows * p.features, p.features);
  }
}

DF_KERNEL_LOOPS void KeyLog2(const PositiveRow& p, int64_t start, int64_t rows, float* out) {
  const int64_t d = p.dim, m = p.features;
  GemmRowMajor(false, false, rows, m, d, 1.0f, p.y + start * d, d, p.w2_DM, m, 0.0f, out, m);
  for (int64_t j = 0; j < rows; ++j) {
    const float* y = p.y + (start + j) * d;
    const float offset = static_cast<float>(0.5 * Dot(y, y, d) * kLog2E);
    float* row = out + j * m;
    for (int64_t i = 0; i < m; ++i) row[i] -= offset;
  }
}

DF_KERNEL_LOOPS void ValuesWithOnes(const PositiveRow& p, int64_t start, int64_t rows, float* out) {
  const int64_t dv = p.value_dim, v = dv + 1;
  for (int64_t j = 0; j < rows; ++j) {
    const float* src = p.v + (start + j) * dv;
    std::copy(src, src + dv, out + j * v);
    out[j * v + dv] = 1.0f;
  }
}

DF_KERNEL_LOOPS void FeatureBackward(const PositiveRow& p, const PositiveRowBackward& b, int64_t pos, int64_t sl,
                                     const float* da_all, const float* dl) {
  const int64_t m = p.features, d = p.dim;
  for (int64_t h = 0; h < p.group; ++h) {
    const float* da = da_all + h * sl * m;
    const float* x = p.x + h * p.x_head_stride + pos * d;
    GemmRowMajor(false, false, sl, d, m, 1.0f, da, m, p.w_MD, d, 0.0f, b.dx + h * b.dx_head_stride + pos * d, d);
    if (b.dw_MD != nullptr) GemmRowMajor(true, false, m, d, sl, 1.0f, da, m, x, d, 1.0f, b.dw_MD, d);
  }
  const float* y = p.y + pos * d;
  float* dy = b.dy + pos * d;
  GemmRowMajor(false, false, sl, d, m, 1.0f, dl, m, p.w_MD, d, 0.0f, dy, d);
  for (int64_t j = 0; j < sl; ++j) {
    const float sum = Sum(dl + j * m, m);
    for (int64_t k = 0; k < d; ++k) dy[j * d + k] -= y[j * d + k] * sum;
  }
  if (b.dw_MD != nullptr) GemmRowMajor(true, false, m, d, sl, 1.0f, dl, m, y, d, 1.0f, b.dw_MD, d);
}

}  // namespace darkformer::raw_cpu
