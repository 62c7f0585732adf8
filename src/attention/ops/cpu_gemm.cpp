// Row-major GEMM through the Fortran BLAS interface (see cpu_gemm.h).
#include "attention/ops/cpu_gemm.h"

// The BLAS LibTorch is built with (BLAS_INFO=mkl in torch's build config) exports the Fortran
// symbol from libtorch_cpu.so; LibTorch's own cpublas::gemm calls the same function for fp32.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace darkformer {

void GemmRowMajor(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  // A row-major matrix is its transpose in column-major order: c^T = op(b)^T op(a)^T.
  const char tb = transpose_b ? 'T' : 'N', ta = transpose_a ? 'T' : 'N';
  const int im = static_cast<int>(n), in = static_cast<int>(m), ik = static_cast<int>(k);
  // BLAS wants leading dimensions >= 1 even for empty operands.
  const int ila = static_cast<int>(lda > 0 ? lda : 1), ilb = static_cast<int>(ldb > 0 ? ldb : 1),
            ilc = static_cast<int>(ldc > 0 ? ldc : 1);
  if (k == 0) {  // BLAS would still scale c by beta; keep the contract explicit.
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    }
    return;
  }
  sgemm_(&tb, &ta, &im, &in, &ik, &alpha, b, &ilb, a, &ila, &beta, c, &ilc);
}

}  // namespace darkformer
