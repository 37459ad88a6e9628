// GEMM through CBLAS. Empty products are handled here because CBLAS rejects leading dimensions
// of 0 (and prints to stderr) even when there is nothing to compute.
#include "common/blas.h"

#include <algorithm>
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

void UseSingleThreadedBlas() {
#if defined(ORTLSTM_BLAS_PREFIX_SCIPY)
  scipy_openblas_set_num_threads(1);
#endif
}

}  // namespace ortlstm
