// The only BLAS call site: row-major GEMMs for float and double, plain or with a pre-packed
// right operand. Which backends are linked (oneMKL, OpenBLAS from scipy-openblas32, or a system
// CBLAS) is decided in CMake (cmake/Blas.cmake); when a build links two (x86-64: oneMKL and
// OpenBLAS), ChooseBlas picks one per process at run time. Nothing else includes a BLAS header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

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

// The right operand op(B) [K, N] of GEMMs C[M, N] = A[M, K] * op(B) + beta * C that all have the
// same M, N, K and B, such as H_{t-1} * R^T at every step of the time loop. When the backend in
// use has a packed GEMM (oneMKL), B is copied once into its internal panel layout and each Multiply runs
// on that copy; otherwise Multiply is an ordinary GEMM on B, which must then outlive this object.
// Multiply with the same A and C gives the same values, call after call.
template <typename T>
class PackedGemmB {
 public:
  PackedGemmB() = default;
  PackedGemmB(bool trans_b, int64_t m, int64_t n, int64_t k, const T* b, int64_t ldb);
  PackedGemmB(PackedGemmB&&) noexcept = default;
  PackedGemmB& operator=(PackedGemmB&&) noexcept = default;

  // C[M, N] = A[M, K] * op(B) + beta * C.
  void Multiply(const T* a, int64_t lda, T beta, T* c, int64_t ldc) const;

 private:
  struct Free {
    void operator()(void* p) const;
  };
  bool trans_b_ = false;
  int64_t m_ = 0;
  int64_t n_ = 0;
  int64_t k_ = 0;
  const T* b_ = nullptr;
  int64_t ldb_ = 0;
  std::unique_ptr<void, Free> packed_;  // null unless oneMKL runs this GEMM and C is not empty
};

// Makes the BLAS run every call on the calling thread: threads come from the executor only.
void UseSingleThreadedBlas();

// Chooses the backend of every later GEMM, once per process (RegisterCustomOps calls it before
// any kernel can run). ORTLSTM_BLAS_BACKEND=mkl|openblas|openblas+mkl forces one; unset or empty,
// the CPU decides: oneMKL on GenuineIntel; on any other vendor openblas+mkl, i.e. OpenBLAS except
// GEMMs of fewer than 16 rows, which run on oneMKL (AMD Zen 3: docs/benchmarks.md), but not those
// of one row where the CPU has AVX-512 (Zen 4: see blas.cc); whichever the build links if only
// one. Returns "" on success, else why not: an unknown value, a backend this build lacks, or a
// different backend than the one this process already uses (the choice is fixed at the first
// registration, so that one process never mixes backends and results stay bitwise reproducible).
// Thread-safe.
std::string ChooseBlas();

// "GenuineIntel", "AuthenticAMD", ... from CPUID, or "" off x86: what the backend choices go by.
std::string CpuVendor();

// The backend in use ("mkl", "openblas", "openblas+mkl" or "system"), choosing it as ChooseBlas would if no
// registration has yet; nullptr if that choice fails (ChooseBlas says why).
const char* BlasBackendName();

}  // namespace ortlstm
