// OpenBLAS (scipy-openblas32) for common/blas.cc (see blas_backends.h); empty unless the build
// links it.
#if defined(ORTLSTM_BLAS_PREFIX_SCIPY)
#include <cblas.h>

#include "common/blas_backends.h"

namespace ortlstm {
namespace blas_backend {
namespace {
CBLAS_TRANSPOSE Trans(bool t) { return t ? CblasTrans : CblasNoTrans; }
}  // namespace

void OpenBlasGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                  const float* b, int ldb, float beta, float* c, int ldc) {
  scipy_cblas_sgemm(CblasRowMajor, Trans(trans_a), Trans(trans_b), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void OpenBlasGemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
                  const double* b, int ldb, double beta, double* c, int ldc) {
  scipy_cblas_dgemm(CblasRowMajor, Trans(trans_a), Trans(trans_b), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void OpenBlasSingleThreaded() { scipy_openblas_set_num_threads(1); }

}  // namespace blas_backend
}  // namespace ortlstm
#endif
