// GEMM through CBLAS, dispatched to the backend chosen for the process (ChooseBlas). Empty
// products are handled here because CBLAS rejects leading dimensions of 0 (and prints to stderr)
// even when there is nothing to compute.
#include "common/blas.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "common/blas_backends.h"
#include "common/cpu_info.h"

#if !defined(ORTLSTM_BLAS_MKL) && !defined(ORTLSTM_BLAS_PREFIX_SCIPY) && !defined(ORTLSTM_BLAS_SYSTEM)
#error "no BLAS backend: cmake/Blas.cmake defines ORTLSTM_BLAS_MKL, ORTLSTM_BLAS_PREFIX_SCIPY or ORTLSTM_BLAS_SYSTEM"
#endif

namespace ortlstm {
namespace {

enum class Backend : int { kNone = 0, kMkl, kOpenBlas, kSystem, kOpenBlasMkl };

// kOpenBlasMkl: OpenBLAS, except GEMMs with fewer rows than this (the time loop's steps at small
// batches) run on oneMKL: on AMD Zen 3 OpenBLAS took 25 us for 1 x 512 x 128 against oneMKL's 7,
// while from 16 rows on the two were even and OpenBLAS faster on the large GEMMs (docs/benchmarks.md).
constexpr int64_t kMixedMklBelowRows = 16;

// ... except on a CPU with AVX-512 (AMD Zen 4 and later), where GEMMs of fewer rows stay on
// OpenBLAS too: there OpenBLAS runs its AVX-512 (SkylakeX) kernels while oneMKL, on a CPU that is
// not Intel's, takes its generic path (MKL_VERBOSE: "Intel(R) Architecture processors", not
// AVX-512). On a Zen 4, one row took OpenBLAS 1.3-4x less time than oneMKL, packed or not
// (1 x 512 x 128 with B transposed, the LSTM's forward step: 3.1 us against 7.2, 4.1 packed;
// 1 x 128 x 512, its backward step: 2.3 against 10.1), and LSTM B1 f+b ran in half the time on
// OpenBLAS alone. oneMKL's packed GEMM of 2-15 rows stayed the faster at the forward's one-block
// steps until S's steps were cut into blocks of units (RunsOnMkl); on Zen 3 (AVX2) oneMKL is the
// faster below 16 rows, one row included.
// (The mixed backend is the automatic choice only on CPUs that are not Intel's, so on its own it
// meets AVX-512 on AMD; forced on an Intel CPU, the same split applies.)
bool SmallGemmsOnOpenBlas() {
  static const bool avx512 = VectorBytes() == 64;
  return avx512;
}

constexpr const char* kEnvironmentVariable = "ORTLSTM_BLAS_BACKEND";

const char* Name(Backend backend) {
  switch (backend) {
    case Backend::kMkl:
      return "mkl";
    case Backend::kOpenBlas:
      return "openblas";
    case Backend::kSystem:
      return "system";
    case Backend::kOpenBlasMkl:
      return "openblas+mkl";
    case Backend::kNone:
      break;
  }
  return "none";
}

bool Linked(Backend backend) {
  switch (backend) {
#if defined(ORTLSTM_BLAS_MKL)
    case Backend::kMkl:
      return true;
#endif
#if defined(ORTLSTM_BLAS_PREFIX_SCIPY)
    case Backend::kOpenBlas:
      return true;
#endif
#if defined(ORTLSTM_BLAS_SYSTEM)
    case Backend::kSystem:
      return true;
#endif
#if defined(ORTLSTM_BLAS_MKL) && defined(ORTLSTM_BLAS_PREFIX_SCIPY)
    case Backend::kOpenBlasMkl:
      return true;
#endif
    default:
      return false;
  }
}

std::string LinkedNames() {
  std::string names;
  for (Backend backend : {Backend::kMkl, Backend::kOpenBlas, Backend::kOpenBlasMkl, Backend::kSystem}) {
    if (!Linked(backend)) continue;
    names += names.empty() ? "" : ", ";
    names += Name(backend);
  }
  return names;
}

// oneMKL where it is fastest (Intel); elsewhere OpenBLAS with oneMKL for GEMMs of few rows, which
// on AMD Zen 3 beat either alone (docs/benchmarks.md); whatever is linked when there is no choice.
Backend Automatic() {
  if (Linked(Backend::kOpenBlasMkl)) {
    return CpuVendor() == "GenuineIntel" ? Backend::kMkl : Backend::kOpenBlasMkl;
  }
  for (Backend backend : {Backend::kMkl, Backend::kOpenBlas, Backend::kSystem}) {
    if (Linked(backend)) return backend;
  }
  return Backend::kNone;
}

std::atomic<Backend> g_backend{Backend::kNone};
std::mutex g_choose_mutex;

// The backend every GEMM uses. Normally set by RegisterCustomOps; a kernel cannot run before, but
// if something calls a GEMM first it gets the automatic choice rather than no BLAS at all.
Backend Active() {
  Backend backend = g_backend.load(std::memory_order_acquire);
  if (backend == Backend::kNone) {
    if (!ChooseBlas().empty()) {
      std::lock_guard<std::mutex> lock(g_choose_mutex);
      Backend expected = Backend::kNone;
      g_backend.compare_exchange_strong(expected, Automatic(), std::memory_order_acq_rel);
    }
    backend = g_backend.load(std::memory_order_acquire);
  }
  return backend;
}

// Whether a GEMM of m rows runs on oneMKL under `backend` (the mixed backend splits by rows),
// packed by PackedGemmB or not. On an AVX-512 CPU that is not Intel's (the rule for one row above)
// the GEMMs of fewer rows stay on OpenBLAS too: its small-matrix AVX-512 kernels beat oneMKL's
// generic path. On AMD Zen 4 (2 cores, loaded, interleaved rounds, 1 thread) the backward's
// per-step dH R at 8 rows took 0.86-0.90x as long (bwd of S (16, 8, 64, 64): GRU 0.205 -> 0.184
// ms, LSTM 0.258 -> 0.222). The forward's packed step (then one block of 8 x 256 x 64 for the
// LSTM) was 1.12-1.16x as slow on OpenBLAS and kept oneMKL until S's steps were cut into two
// blocks (MinBlockWork): then, 2 threads, alternating processes, OpenBLAS took S's forward 0.71x
// (GRU) and 0.74x (LSTM) as long, its backward 0.96x and 0.87x, the RNN's 0.97x / 0.92x.
bool RunsOnMkl(Backend backend, int64_t m) {
  if (backend == Backend::kMkl) return true;
  if (backend != Backend::kOpenBlasMkl) return false;
  return m < kMixedMklBelowRows && !SmallGemmsOnOpenBlas();
}

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

// CBLAS takes int dimensions; the adapter's shape checks keep every dimension within range.
int Int(int64_t value) {
  assert(value >= 0 && value <= INT_MAX);
  return static_cast<int>(value);
}

template <typename T>
void Dispatch(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
              const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (ScaleOnly(m, n, k, beta, c, ldc)) return;
  Backend backend = Active();
  if (backend == Backend::kOpenBlasMkl) backend = RunsOnMkl(backend, m) ? Backend::kMkl : Backend::kOpenBlas;
  switch (backend) {
#if defined(ORTLSTM_BLAS_MKL)
    case Backend::kMkl:
      blas_backend::MklGemm(trans_a, trans_b, Int(m), Int(n), Int(k), alpha, a, Int(lda), b, Int(ldb), beta, c,
                            Int(ldc));
      return;
#endif
#if defined(ORTLSTM_BLAS_PREFIX_SCIPY)
    case Backend::kOpenBlas:
      blas_backend::OpenBlasGemm(trans_a, trans_b, Int(m), Int(n), Int(k), alpha, a, Int(lda), b, Int(ldb), beta, c,
                                 Int(ldc));
      return;
#endif
#if defined(ORTLSTM_BLAS_SYSTEM)
    case Backend::kSystem:
      blas_backend::SystemGemm(trans_a, trans_b, Int(m), Int(n), Int(k), alpha, a, Int(lda), b, Int(ldb), beta, c,
                               Int(ldc));
      return;
#endif
    default:
      break;
  }
  assert(false && "no BLAS backend chosen");
  std::abort();
}

constexpr std::align_val_t kPackedAlignment{64};

}  // namespace

std::string CpuVendor() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned int max_leaf = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &max_leaf, &ebx, &ecx, &edx) == 0) return "";
  char vendor[13];
  std::memcpy(vendor + 0, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  vendor[12] = '\0';
  return vendor;
#else
  return "";
#endif
}

std::string ChooseBlas() {
  const char* forced = std::getenv(kEnvironmentVariable);
  Backend wanted = Backend::kNone;
  const bool is_forced = forced != nullptr && forced[0] != '\0';
  if (is_forced) {
    const std::string value(forced);
    if (value == "mkl") {
      wanted = Backend::kMkl;
    } else if (value == "openblas") {
      wanted = Backend::kOpenBlas;
    } else if (value == "openblas+mkl") {
      wanted = Backend::kOpenBlasMkl;
    } else if (value == "system") {
      wanted = Backend::kSystem;
    } else {
      return std::string(kEnvironmentVariable) + "='" + value +
             "' is not a BLAS backend: expected mkl, openblas or openblas+mkl (this build links " + LinkedNames() +
             "), or unset for the choice by CPU";
    }
    if (!Linked(wanted)) {
      return std::string(kEnvironmentVariable) + "=" + value + ", but this build of ortlstm does not link " +
             Name(wanted) + " (it links " + LinkedNames() + "; see cmake/Blas.cmake)";
    }
  } else {
    wanted = Automatic();
  }
  std::lock_guard<std::mutex> lock(g_choose_mutex);
  const Backend current = g_backend.load(std::memory_order_acquire);
  if (current == Backend::kNone) {
    g_backend.store(wanted, std::memory_order_release);
    return "";
  }
  if (is_forced && current != wanted) {
    return std::string(kEnvironmentVariable) + "=" + Name(wanted) + ", but this process already runs ortlstm on " +
           Name(current) + " (the backend is chosen once per process, when the library is first registered)";
  }
  return "";
}

const char* BlasBackendName() {
  if (g_backend.load(std::memory_order_acquire) == Backend::kNone && !ChooseBlas().empty()) return nullptr;
  return Name(g_backend.load(std::memory_order_acquire));
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  Dispatch(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  Dispatch(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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
  if (m == 0 || n == 0 || k == 0 || !RunsOnMkl(Active(), m)) return;
  packed_.reset(::operator new(blas_backend::MklPackedSize(T(), Int(m), Int(n), Int(k)), kPackedAlignment));
  blas_backend::MklPack(trans_b, Int(m), Int(n), Int(k), b, Int(ldb), packed_.get());
#endif
}

template <typename T>
void PackedGemmB<T>::Multiply(const T* a, int64_t lda, T beta, T* c, int64_t ldc) const {
#if defined(ORTLSTM_BLAS_MKL)
  if (packed_) {
    blas_backend::MklCompute(Int(m_), Int(n_), Int(k_), a, Int(lda), packed_.get(), beta, c, Int(ldc));
    return;
  }
#endif
  Gemm(false, trans_b_, m_, n_, k_, T(1), a, lda, b_, ldb_, beta, c, ldc);
}

template class PackedGemmB<float>;
template class PackedGemmB<double>;

void UseSingleThreadedBlas() {
  // oneMKL is linked with its sequential layer; OpenBLAS starts with as many threads as cores.
#if defined(ORTLSTM_BLAS_PREFIX_SCIPY)
  blas_backend::OpenBlasSingleThreaded();
#endif
}

}  // namespace ortlstm
