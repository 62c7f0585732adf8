// Worst-case fp32 rounding bounds for tests that hold an fp32 computation against fp64 (issue 50).
// A tolerance read off one machine's output holds on that machine's code path only: MKL's paths
// (AVX2, AVX-512, COMPATIBLE) and ATen's vector width change the order of every sum, and with it
// the error. These hold on every path: whatever the order, a sum of n terms computed in floating
// point is within gamma_n sum |terms| of the exact sum, and a product of n roundings within a
// factor (1 +- gamma_n), gamma_n = n u / (1 - n u), u = 2^-24 (Higham, "Accuracy and Stability of
// Numerical Algorithms", 2nd ed., Lemma 3.1 and section 3.1; a fused multiply-add only removes a
// rounding). Each test states its terms and magnitudes; these helpers turn them into a bound.
#pragma once

#include <cmath>
#include <limits>

namespace darkformer::testing {

constexpr double kFp32Unit = 0x1p-24;  // u, fp32's unit roundoff

// gamma_n = n u / (1 - n u).
inline double Gamma(double n) {
  const double nu = n * kFp32Unit;
  return nu < 1 ? nu / (1 - nu) : std::numeric_limits<double>::infinity();
}

// Relative error of a weight's scale carried through at most `factors` exps and products (a chunked
// form rescales its running state once per chunk), whose exact arguments add up to
// `argument_sum` in magnitude: each exp within 4 u (fast_exp2's 2e-7 = 3.4 u, libm's one ulp, and
// the result's rounding), each product u, each argument's rounding u times its magnitude.
inline double ScaleChainError(double factors, double argument_sum) { return (5 * factors + argument_sum) * kFp32Unit; }

// A normalised average of positive weights, out = sum_j w_j v_j / sum_j w_j, computed in fp32 with
// each weight's relative error at most `weight_error` (features, scales), each sum over at most
// `terms` terms and the values rounded to fp32 once: with eta = (1 + weight_error)(1 + gamma_terms) - 1,
// numerator and normaliser are off by at most eta sum_j w_j |v_j| <= eta den max|v| and eta den, so
//   |out~ - out| <= (2 eta / (1 - eta)) (1 + u) max|v| + u max|v| (the division) + u max|v| (v's rounding).
inline double PositiveAverageBound(double weight_error, double terms, double max_abs_value) {
  const double eta = (1 + weight_error) * (1 + Gamma(terms)) - 1;
  if (eta >= 1) return std::numeric_limits<double>::infinity();
  return (2 * eta / (1 - eta) * (1 + kFp32Unit) + 2 * kFp32Unit) * max_abs_value;
}

// A ratio out = num / den whose fp32 numerator and normaliser are within `num_error` and
// `den_error` of the exact ones: |out~ - out| <= (num_error + |out| den_error) / (|den| - den_error)
// plus the division's rounding u |out~|. Infinite where den_error reaches |den| (the normaliser's
// sign is then not known: no bound).
inline double RatioBound(double num_error, double den_error, double out, double den) {
  const double margin = std::abs(den) - den_error;
  if (!(margin > 0)) return std::numeric_limits<double>::infinity();
  const double shift = (num_error + std::abs(out) * den_error) / margin;
  return shift + kFp32Unit * (std::abs(out) + shift);
}

}  // namespace darkformer::testing
