// The system CBLAS for common/blas.cc (see blas_backends.h); empty unless the build links it.
#if defined(ORTLSTM_BLAS_SYSTEM)
#include <cblas.h>

#include "common/blas_backends.h"

namespace ortlstm {
namespace blas_backend {
namespace {
CBLAS_TRANSPOSE Trans(bool t) { return t ? CblasTrans : CblasNoTrans; }
}  // namespace

void SystemGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, Trans(trans_a), Trans(trans_b), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void SystemGemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
                const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, Trans(trans_a), Trans(trans_b), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace blas_backend
}  // namespace ortlstm
#endif
