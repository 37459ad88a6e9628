// GEMM through CBLAS. Empty products are handled here because CBLAS rejects leading dimensions
// of 0 (and prints to stderr) even when there is nothing to compute.
#include "common/blas.h"

#include <cassert>
#include <climits>

#include <cblas.h>

#if defined(ORTLSTM_BLAS_PREFIX_SCIPY)
#define ORTLSTM_CBLAS(name) scipy_cblas_##name
#else
#define ORTLSTM_CBLAS(name) cblas_##name
#endif

namespace ortlstm {
namespace {

template <typename T>
bool ScaleOnly(int64_t m, int64_t n, int64_t k, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return true;
  if (k != 0) return false;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
  }
  return true;
}

CBLAS_TRANSPOSE Trans(bool t) { return t ? CblasTrans : CblasNoTrans; }

}  // namespace

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (ScaleOnly(m, n, k, beta, c, ldc)) return;
  assert(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
  ORTLSTM_CBLAS(sgemm)(CblasRowMajor, Trans(trans_a), Trans(trans_b), static_cast<int>(m), static_cast<int>(n),
                       static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
                       static_cast<int>(ldc));
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (ScaleOnly(m, n, k, beta, c, ldc)) return;
  assert(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
  ORTLSTM_CBLAS(dgemm)(CblasRowMajor, Trans(trans_a), Trans(trans_b), static_cast<int>(m), static_cast<int>(n),
                       static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
                       static_cast<int>(ldc));
}

}  // namespace ortlstm
