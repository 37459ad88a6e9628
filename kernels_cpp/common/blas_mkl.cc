// oneMKL's CBLAS for common/blas.cc (see blas_backends.h); empty unless the build links oneMKL.
#if defined(ORTLSTM_BLAS_MKL)
#include <mkl_cblas.h>

#include "common/blas_backends.h"

namespace ortlstm {
namespace blas_backend {
namespace {
CBLAS_TRANSPOSE Trans(bool t) { return t ? CblasTrans : CblasNoTrans; }
}  // namespace

void MklGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
             int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, Trans(trans_a), Trans(trans_b), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void MklGemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
             const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, Trans(trans_a), Trans(trans_b), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
size_t MklPackedSize(float, int m, int n, int k) { return cblas_sgemm_pack_get_size(CblasBMatrix, m, n, k); }
size_t MklPackedSize(double, int m, int n, int k) { return cblas_dgemm_pack_get_size(CblasBMatrix, m, n, k); }
void MklPack(bool trans_b, int m, int n, int k, const float* b, int ldb, void* packed) {
  cblas_sgemm_pack(CblasRowMajor, CblasBMatrix, Trans(trans_b), m, n, k, 1.0f, b, ldb, static_cast<float*>(packed));
}
void MklPack(bool trans_b, int m, int n, int k, const double* b, int ldb, void* packed) {
  cblas_dgemm_pack(CblasRowMajor, CblasBMatrix, Trans(trans_b), m, n, k, 1.0, b, ldb, static_cast<double*>(packed));
}
void MklCompute(int m, int n, int k, const float* a, int lda, const void* packed, float beta, float* c, int ldc) {
  cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, m, n, k, a, lda, static_cast<const float*>(packed), n,
                      beta, c, ldc);
}
void MklCompute(int m, int n, int k, const double* a, int lda, const void* packed, double beta, double* c, int ldc) {
  cblas_dgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, m, n, k, a, lda, static_cast<const double*>(packed),
                      n, beta, c, ldc);
}
void MklGemmBf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const unsigned short* a, int lda,
                 const unsigned short* b, int ldb, float beta, float* c, int ldc) {
  cblas_gemm_bf16bf16f32(CblasRowMajor, Trans(trans_a), Trans(trans_b), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
size_t MklPackedSizeBf16(int m, int n, int k) { return cblas_gemm_bf16bf16f32_pack_get_size(CblasBMatrix, m, n, k); }
void MklPackBf16(bool trans_b, int m, int n, int k, const unsigned short* b, int ldb, void* packed) {
  cblas_gemm_bf16bf16f32_pack(CblasRowMajor, CblasBMatrix, Trans(trans_b), m, n, k, b, ldb,
                              static_cast<MKL_BF16*>(packed));
}
void MklComputeBf16(int m, int n, int k, float alpha, const unsigned short* a, int lda, const void* packed,
                    float beta, float* c, int ldc) {
  cblas_gemm_bf16bf16f32_compute(CblasRowMajor, CblasNoTrans, CblasPacked, m, n, k, alpha, a, lda,
                                 static_cast<const MKL_BF16*>(packed), n, beta, c, ldc);
}

}  // namespace blas_backend
}  // namespace ortlstm
#endif
