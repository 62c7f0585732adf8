// Base-2 exponentials of the raw CPU kernel (raw_cpu_kernel.h), eight lanes at a time where the
// CPU has AVX2 and FMA. Loops on raw fp32 memory: callers check device, dtype, layout and
// Exp2LoopsVectorised() and keep the LibTorch ops for everything else (CUDA, fp64, CPUs without
// AVX2).
//
// 2^x = 2^n 2^f with n = round(x), f in [-1/2, 1/2], 2^f by a degree-6 polynomial (least squares
// in relative error, fitted for this file): relative error <= 2e-7 in fp32 (tests/attention/
// fast_exp2_test.cpp), below fp32's own rounding of the features' logits. Inputs below -126 give
// 0 (2^-126 is fp32's smallest normal; a feature that small next to its row max is nothing); NaN
// stays NaN.
#pragma once

#include <cstdint>

namespace darkformer {

// 2^x for x[0..n), in place.
void Exp2InPlace(float* x, int64_t n);

// Fused passes of the per-feature stabiliser's sub-chunk pairs (raw_cpu_kernel.cpp), over n
// features: e_i = 2^((a_i + b_i) - shift), never stored.
// sum_i e_i.
float SumExp2OfSum(const float* a, const float* b, float shift, int64_t n);
// da_i += weight e_i and db_i += weight e_i; returns sum_i e_i.
float AccumulateExp2OfSum(const float* a, const float* b, float shift, float weight, float* da, float* db, int64_t n);
// out_i = 2^((a_i + b_i) - shift).
void Exp2OfSum(const float* a, const float* b, float shift, float* out, int64_t n);

// True where the loops run eight lanes at a time (x86-64 with AVX2 and FMA). Elsewhere their
// one-value-at-a-time path is ~10x slower than LibTorch's own vectorised exp2: callers keep the
// LibTorch ops there.
bool Exp2LoopsVectorised();

// Tests: true runs the one-value-at-a-time path even where AVX2 is there (both must agree).
void ForceScalarExp2ForTesting(bool scalar);

}  // namespace darkformer
