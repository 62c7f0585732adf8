// MKL's vector-math kernels chosen before any parallel work (util/vector_math_kernels.h): in a
// fresh process, as ctest runs every test, each function's first call split across two threads is
// within VML's high-accuracy bound on every element, in float and in double.
// Without the choice in main (test_main.cpp), on an Intel Xeon this test failed in 14 processes of
// 400 (0 of 400 with it): the process's first VML call, acos here, ran its second thread's chunk
// with a low-accuracy kernel (up to 265 ulp); later calls, of any function, were exact. Run in a
// process whose earlier tests made these calls, it proves nothing (the bound still holds).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>

#include "util/vector_math_kernels.h"

namespace darkformer {
namespace {

// erfinv has no <cmath> reference: Newton on erfl from the value under test, to long double's precision.
long double InverseErf(long double x, long double guess) {
  const long double two_over_root_pi = 2.0L / std::sqrt(3.14159265358979323846264338327950288L);
  long double y = guess;
  for (int i = 0; i < 6; ++i) y -= (std::erf(y) - x) / (two_over_root_pi * std::exp(-y * y));
  return y;
}

long double Reference(const std::string& name, long double x, long double value) {
  static const std::map<std::string, long double (*)(long double)> functions = {
      {"acos", [](long double v) { return std::acos(v); }},   {"asin", [](long double v) { return std::asin(v); }},
      {"atan", [](long double v) { return std::atan(v); }},   {"cos", [](long double v) { return std::cos(v); }},
      {"erf", [](long double v) { return std::erf(v); }},     {"erfc", [](long double v) { return std::erfc(v); }},
      {"exp", [](long double v) { return std::exp(v); }},     {"log", [](long double v) { return std::log(v); }},
      {"log10", [](long double v) { return std::log10(v); }}, {"log2", [](long double v) { return std::log2(v); }},
      {"sin", [](long double v) { return std::sin(v); }},     {"sqrt", [](long double v) { return std::sqrt(v); }},
      {"tan", [](long double v) { return std::tan(v); }},     {"tanh", [](long double v) { return std::tanh(v); }},
      {"trunc", [](long double v) { return std::trunc(v); }},
  };
  if (name == "erfinv") return InverseErf(x, value);
  const auto found = functions.find(name);
  if (found == functions.end()) ADD_FAILURE() << "no reference for " << name;
  return found == functions.end() ? value : found->second(x);
}

TEST(VectorMathKernelsTest, FirstCallsSplitAcrossThreadsAreAccurate) {
  ASSERT_GE(torch::get_num_threads(), 2) << "test_main.cpp sets two intra-op threads";
  // Without the choice, the race showed only once MKL's BLAS had run, as a model's matmuls have
  // before its first exp: in 5 of 400 first exps, against 0 of 600 with no matmul before them.
  torch::matmul(torch::randn({40, 16}), torch::randn({16, 8}));
  // Two chunks of ATen's grain size (2,048) or more: each thread runs VML on its own chunk.
  constexpr int64_t kElements = 8192;
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    // VML's high-accuracy kernels promise about 1 ulp, at most 2^-(p-1) |y| with p mantissa bits;
    // the long double reference adds nothing at this scale. Twice that is the bound; the
    // low-accuracy kernels miss it by hundreds of ulp.
    const double ulp = dtype == torch::kFloat32 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -52);
    const auto x = torch::linspace(0.05, 0.95, kElements, torch::TensorOptions().dtype(dtype));
    const auto x64 = x.to(torch::kFloat64);
    for (const auto& function : VectorMathFunctions()) {
      const auto y = function.apply(x).to(torch::kFloat64);
      const auto* xs = x64.data_ptr<double>();
      const auto* ys = y.data_ptr<double>();
      int64_t misses = 0, first_miss = -1;
      double worst_ulps = 0.0;
      for (int64_t i = 0; i < kElements; ++i) {
        const long double reference = Reference(function.name, xs[i], ys[i]);
        const double error = static_cast<double>(std::fabs(ys[i] - reference));
        const double scale = static_cast<double>(std::fabs(reference));
        if (error > 2.0 * ulp * scale) {
          ++misses;
          if (first_miss < 0) first_miss = i;
        }
        if (scale > 0) worst_ulps = std::max(worst_ulps, error / scale / ulp);
      }
      EXPECT_EQ(misses, 0) << function.name << " in " << c10::toString(dtype) << ": " << misses << " of " << kElements
                           << " elements beyond 2 ulp, the first at " << first_miss << ", the worst " << worst_ulps
                           << " ulp";
    }
  }
}

}  // namespace
}  // namespace darkformer
