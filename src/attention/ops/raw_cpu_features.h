// The raw CPU kernel's features on raw fp32 memory (raw_cpu_kernel.h): base-2 log-features of a
// block of query and key positions (one BLAS call per head), [v, 1], and the features' backward
// from d/d(log phi); with the lane sums the kernel's loops share.
#pragma once

#include <cstdint>

#include "attention/ops/raw_cpu_kernel.h"

// The kernel runs only where fast_exp2's loops run vectorised (x86-64 with AVX2 and FMA, checked at
// run time by the caller), so its elementwise loops may use them too; per function, not per file:
// inline library code compiled with AVX2 in such a file could be picked by the linker for others.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DF_KERNEL_LOOPS __attribute__((target("avx2,fma")))
#else
#define DF_KERNEL_LOOPS
#endif

namespace darkformer::raw_cpu {

// sum_k a[k] b[k] and sum_k a[k] in eight independent partial sums (a vector register's lanes;
// one running sum is a chain of dependent adds the compiler may not reorder).
float Dot(const float* a, const float* b, int64_t n);
float Sum(const float* a, int64_t n);

// Query log-features a = x W^T log2(e) of `rows` positions from `start`, each head's rows
// together: out (G rows x m). A query's own -|x|^2/2 - log(m)/2 shifts all its arguments and cancels.
void QueryLog2(const PositiveRow& p, int64_t start, int64_t rows, float* out);
// Key log-features l = (y W^T - |y|^2/2) log2(e) of `rows` positions from `start`: out (rows x m).
// Every key's -log(m)/2 cancels.
void KeyLog2(const PositiveRow& p, int64_t start, int64_t rows, float* out);
// [v_j, 1] for `rows` positions from `start`: out (rows x V).
void ValuesWithOnes(const PositiveRow& p, int64_t start, int64_t rows, float* out);

// The features' backward for `sl` positions from `pos`: queries dx = da W (their log-features carry
// no -|x|^2/2), keys dy = dl W - y sum_m dl; dW += da^T x + dl^T y. da (G sl x m, head h at
// h sl m) and dl (sl x m) are d/d(natural log phi).
void FeatureBackward(const PositiveRow& p, const PositiveRowBackward& b, int64_t pos, int64_t sl, const float* da,
                     const float* dl);

}  // namespace darkformer::raw_cpu
