// GEMM through CBLAS. Empty products are handled here because CBLAS rejects leading dimensions
// of 0 (and prints to stderr) even when there is nothing to compute.
#include "common/blas.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <new>

#if defined(ORTLSTM_BLAS_MKL)
#include <mkl_cblas.h>
#define ORTLSTM_CBLAS(name) cblas_##name
#elif defined(ORTLSTM_BLAS_PREFIX_SCIPY)
#include <cblas.h>
#define ORTLSTM_CBLAS(name) scipy_cblas_##name
#else
#include <cblas.h>
#define ORTLSTM_CBLAS(name) cblas_##name
#endif

namespace ortlstm {
namespace {

template <typename T>
bool ScaleOnly(int64_t m, int64_t n, int64_t k, T beta, T* c, int64_t ldc) {
  assert(m >= 0 && n >= 0 && k >= 0);
  if (m == 0 || n == 0) return true;
  if (k != 0) return false;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
  }
  return true;
}

CBLAS_TRANSPOSE Trans(bool t) { return t ? CblasTrans : CblasNoTrans; }

// CBLAS takes int dimensions; the adapter's shape checks keep every dimension within range.
int Int(int64_t value) {
  assert(value >= 0 && value <= INT_MAX);
  return static_cast<int>(value);
}

#if defined(ORTLSTM_BLAS_MKL)
// oneMKL's packed GEMM, by element type.
size_t PackedSize(float, int64_t m, int64_t n, int64_t k) {
  return cblas_sgemm_pack_get_size(CblasBMatrix, Int(m), Int(n), Int(k));
}
size_t PackedSize(double, int64_t m, int64_t n, int64_t k) {
  return cblas_dgemm_pack_get_size(CblasBMatrix, Int(m), Int(n), Int(k));
}
void Pack(bool trans_b, int64_t m, int64_t n, int64_t k, const float* b, int64_t ldb, void* packed) {
  cblas_sgemm_pack(CblasRowMajor, CblasBMatrix, Trans(trans_b), Int(m), Int(n), Int(k), 1.0f, b, Int(ldb),
                   static_cast<float*>(packed));
}
void Pack(bool trans_b, int64_t m, int64_t n, int64_t k, const double* b, int64_t ldb, void* packed) {
  cblas_dgemm_pack(CblasRowMajor, CblasBMatrix, Trans(trans_b), Int(m), Int(n), Int(k), 1.0, b, Int(ldb),
                   static_cast<double*>(packed));
}
void Compute(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const void* packed, float beta, float* c,
             int64_t ldc) {
  cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, Int(m), Int(n), Int(k), a, Int(lda),
                      static_cast<const float*>(packed), Int(n), beta, c, Int(ldc));
}
void Compute(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const void* packed, double beta,
             double* c, int64_t ldc) {
  cblas_dgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, Int(m), Int(n), Int(k), a, Int(lda),
                      static_cast<const double*>(packed), Int(n), beta, c, Int(ldc));
}
#endif

constexpr std::align_val_t kPackedAlignment{64};

}  // namespace

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (ScaleOnly(m, n, k, beta, c, ldc)) return;
  ORTLSTM_CBLAS(sgemm)(CblasRowMajor, Trans(trans_a), Trans(trans_b), Int(m), Int(n), Int(k), alpha, a, Int(lda), b,
                       Int(ldb), beta, c, Int(ldc));
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (ScaleOnly(m, n, k, beta, c, ldc)) return;
  ORTLSTM_CBLAS(dgemm)(CblasRowMajor, Trans(trans_a), Trans(trans_b), Int(m), Int(n), Int(k), alpha, a, Int(lda), b,
                       Int(ldb), beta, c, Int(ldc));
}

template <typename T>
void ParallelGemm(const Executor& executor, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                  const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  // Blocks of at least this many multiply-adds: below it, splitting costs more than it saves.
  constexpr int64_t kMinBlockWork = int64_t{1} << 18;
  const int64_t by_work = (m * n * k) / kMinBlockWork;
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(executor.Width(), by_work));
  if (parts == 1) {
    Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const bool split_rows = m >= n;
  const int64_t extent = split_rows ? m : n;
  const int64_t blocks = std::min(parts, extent);
  executor.For(static_cast<size_t>(blocks), [&](size_t index) {
    const Range r = SplitRange(extent, blocks, static_cast<int64_t>(index));
    if (r.end == r.begin) return;
    if (split_rows) {
      const T* a_block = trans_a ? a + r.begin : a + r.begin * lda;
      Gemm(trans_a, trans_b, r.end - r.begin, n, k, alpha, a_block, lda, b, ldb, beta, c + r.begin * ldc, ldc);
    } else {
      const T* b_block = trans_b ? b + r.begin * ldb : b + r.begin;
      Gemm(trans_a, trans_b, m, r.end - r.begin, k, alpha, a, lda, b_block, ldb, beta, c + r.begin, ldc);
    }
  });
}

template void ParallelGemm<float>(const Executor&, bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                                  const float*, int64_t, float, float*, int64_t);
template void ParallelGemm<double>(const Executor&, bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                   int64_t, const double*, int64_t, double, double*, int64_t);

template <typename T>
void PackedGemmB<T>::Free::operator()(void* p) const {
  ::operator delete(p, kPackedAlignment);
}

template <typename T>
PackedGemmB<T>::PackedGemmB(bool trans_b, int64_t m, int64_t n, int64_t k, const T* b, int64_t ldb)
    : trans_b_(trans_b), m_(m), n_(n), k_(k), b_(b), ldb_(ldb) {
#if defined(ORTLSTM_BLAS_MKL)
  if (m == 0 || n == 0 || k == 0) return;
  packed_.reset(::operator new(PackedSize(T(), m, n, k), kPackedAlignment));
  Pack(trans_b, m, n, k, b, ldb, packed_.get());
#endif
}

template <typename T>
void PackedGemmB<T>::Multiply(const T* a, int64_t lda, T beta, T* c, int64_t ldc) const {
#if defined(ORTLSTM_BLAS_MKL)
  if (packed_) {
    Compute(m_, n_, k_, a, lda, packed_.get(), beta, c, ldc);
    return;
  }
#endif
  Gemm(false, trans_b_, m_, n_, k_, T(1), a, lda, b_, ldb_, beta, c, ldc);
}

template class PackedGemmB<float>;
template class PackedGemmB<double>;

void UseSingleThreadedBlas() {
#if defined(ORTLSTM_BLAS_PREFIX_SCIPY)
  scipy_openblas_set_num_threads(1);
#endif
}

}  // namespace ortlstm
