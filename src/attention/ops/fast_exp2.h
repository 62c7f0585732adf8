// Base-2 exponentials of the fused causal operator's CPU path, each fused with the pass around
// it (ops/chunk_loop.cpp). LibTorch's amax, sub_ and exp2_ over a chunk's C x m feature
// block are three passes at ~0.8 ns per element on this project's CPUs; here it is one reduction
// and one exp2 pass, eight lanes at a time where the CPU has AVX2 and FMA. Loops on raw fp32
// memory: callers check device, dtype, layout and Exp2LoopsVectorised() and keep the LibTorch
// ops for everything else (CUDA, fp64, CPUs without AVX2).
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

// Each of `rows` rows of `cols` contiguous floats: max_out[r] = max_c x[r][c], then
// x[r][c] = 2^(x[r][c] - max_out[r]) (every value in (0, 1], the row max at 1).
void ShiftExp2Rows(float* x, int64_t rows, int64_t cols, float* max_out);

// Causal weights of one chunk applied in place to `count` blocks, each rows x group x c x c
// contiguous (row r's G query heads, then query i, key j):
//   block[r][g][i][j] *= (j <= i) ? 2^(b[r][j] - ref[r][i]) : 0,
// with b and ref rows of c contiguous floats, `b_row_stride` / `ref_row_stride` apart.
void MulCausalWeights(float* const* blocks, int count, int64_t rows, int64_t group, int64_t c, const float* b,
                      int64_t b_row_stride, const float* ref, int64_t ref_row_stride);

// True where the loops run eight lanes at a time (x86-64 with AVX2 and FMA). Elsewhere their
// one-value-at-a-time path is ~10x slower than LibTorch's own vectorised exp2: callers keep the
// LibTorch ops there.
bool Exp2LoopsVectorised();

// Tests: true runs the one-value-at-a-time path even where AVX2 is there (both must agree).
void ForceScalarExp2ForTesting(bool scalar);

}  // namespace darkformer
