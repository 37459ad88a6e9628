// Internal to common/blas.cc: the CBLAS entry points of each backend this build links, one
// translation unit per backend (blas_mkl.cc, blas_openblas.cc, blas_system.cc) because their
// cblas.h headers declare the same enums and cannot be included together. Row-major throughout;
// dimensions already checked to fit an int. Nothing but blas.cc includes this header.
#pragma once

#include <cstddef>

namespace ortlstm {
namespace blas_backend {

#if defined(ORTLSTM_BLAS_MKL)
// oneMKL, linked statically, sequential layer.
void MklGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
             int ldb, float beta, float* c, int ldc);
void MklGemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
             const double* b, int ldb, double beta, double* c, int ldc);
// The packed GEMM (cblas_?gemm_pack_get_size / pack / compute) for the right operand.
size_t MklPackedSize(float, int m, int n, int k);
size_t MklPackedSize(double, int m, int n, int k);
void MklPack(bool trans_b, int m, int n, int k, const float* b, int ldb, void* packed);
void MklPack(bool trans_b, int m, int n, int k, const double* b, int ldb, void* packed);
void MklCompute(int m, int n, int k, const float* a, int lda, const void* packed, float beta, float* c, int ldc);
void MklCompute(int m, int n, int k, const double* a, int lda, const void* packed, double beta, double* c, int ldc);
// The bf16 GEMM (cblas_gemm_bf16bf16f32 and its packed variant; operands are bfloat16 bits) for common/bf16_gemm.cc.
void MklGemmBf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const unsigned short* a, int lda,
                 const unsigned short* b, int ldb, float beta, float* c, int ldc);
size_t MklPackedSizeBf16(int m, int n, int k);
void MklPackBf16(bool trans_b, int m, int n, int k, const unsigned short* b, int ldb, void* packed);
void MklComputeBf16(int m, int n, int k, float alpha, const unsigned short* a, int lda, const void* packed,
                    float beta, float* c, int ldc);
#endif

#if defined(ORTLSTM_BLAS_PREFIX_SCIPY)
// OpenBLAS from the scipy-openblas32 wheel (scipy_cblas_* names), a shared library.
void OpenBlasGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                  const float* b, int ldb, float beta, float* c, int ldc);
void OpenBlasGemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
                  const double* b, int ldb, double beta, double* c, int ldc);
void OpenBlasSingleThreaded();
#endif

#if defined(ORTLSTM_BLAS_SYSTEM)
// The system CBLAS found by CMake (cblas_* names).
void SystemGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                int ldb, float beta, float* c, int ldc);
void SystemGemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
                const double* b, int ldb, double beta, double* c, int ldc);
#endif

}  // namespace blas_backend
}  // namespace ortlstm
