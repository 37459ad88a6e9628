// The only BLAS call site: one row-major GEMM for float and double. The backend (OpenBLAS from
// scipy-openblas32, or a system CBLAS) is chosen in CMake; nothing else includes cblas.h.
#pragma once

#include <cstdint>

#include "common/parallel.h"

namespace ortlstm {

// C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C, all row-major with leading dimensions
// lda, ldb, ldc; op(X) = X^T when the matching trans flag is set.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

// The same GEMM cut into row or column blocks of C, run as tasks of `executor`, each a
// single-threaded BLAS call. Blocks are fixed by the shapes and executor.Width(), and each element
// of C is computed by one call over the full K, so the result does not depend on scheduling.
template <typename T>
void ParallelGemm(const Executor& executor, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                  const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// Makes the BLAS run every call on the calling thread: threads come from the executor only.
void UseSingleThreadedBlas();

}  // namespace ortlstm
