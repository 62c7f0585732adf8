// Row-major fp32 GEMM on raw memory for the fused operator's CPU kernel (raw_cpu_kernel.h):
// the BLAS sgemm_ LibTorch itself links and calls for fp32 matmuls on the CPU (MKL in the PyPI
// wheels), without a dispatcher round trip per call (~10 us on this project's CPUs, against
// ~20-100 us of arithmetic in a chunk's products).
#pragma once

#include <cstdint>

namespace darkformer {

// c (m x n, row stride ldc) = alpha op(a) op(b) + beta c, every matrix row-major: op(a) is m x k
// (a stored k x m when transpose_a), op(b) is k x n (b stored n x k when transpose_b).
void GemmRowMajor(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace darkformer
