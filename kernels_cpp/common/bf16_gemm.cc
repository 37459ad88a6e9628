// The bf16 GEMM layer (common/bf16_gemm.h): rounding, the backend choice, the GEMMs and the
// reusable bf16 right operand.
#include "common/bf16_gemm.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "common/blas.h"
#include "common/blas_backends.h"
#if defined(ORTLSTM_ONEDNN)
#include "common/bf16_onednn.h"
#endif

// The conversion loops are built for AVX-512, AVX2 and baseline x86-64 and picked at load time, as
// lstm/standard_cell.cc's cell (its comment says why arch=x86-64-v3): the baseline's SSE2 loop took
// ~7 % of an op call at M on Zen 4 rounding the big GEMMs' operands (issue 33); integer operations
// only, so every clone gives the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && !defined(__clang__)
#define ORTLSTM_ROUND_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define ORTLSTM_ROUND_CLONES
#endif

namespace ortlstm {
namespace {

enum class Bf16Backend : int { kNone = 0, kMkl, kFallback, kOnednn };

constexpr const char* kEnvironmentVariable = "ORTLSTM_BF16_GEMM";

const char* Name(Bf16Backend backend) {
  switch (backend) {
    case Bf16Backend::kMkl:
      return "mkl";
    case Bf16Backend::kFallback:
      return "fallback";
    case Bf16Backend::kOnednn:
      return "onednn";
    case Bf16Backend::kNone:
      break;
  }
  return "none";
}

constexpr bool kMklLinked =
#if defined(ORTLSTM_BLAS_MKL)
    true;
#else
    false;
#endif

constexpr bool kOnednnBuilt =
#if defined(ORTLSTM_ONEDNN)
    true;
#else
    false;
#endif

// oneMKL's bf16 GEMM on Intel CPUs with bf16 units (AMX, AVX512-BF16) where the build links it;
// oneDNN's matmul on other CPUs with bf16 units (AMD Zen 4, 5) where the build has its headers
// (libdnnl itself is loaded at the first bf16 GEMM; if it will not load, the fallback with a
// warning); else the fallback. On AMD Zen 4 (AVX512-BF16) oneMKL's bf16 GEMM was no faster than the
// fallback and both slower than float32 (docs/benchmarks.md): oneMKL does not use AMD's bf16 units,
// oneDNN does.
Bf16Backend Automatic() {
  if (!CpuHasBf16Units()) return Bf16Backend::kFallback;
  if (kMklLinked && CpuVendor() == "GenuineIntel") return Bf16Backend::kMkl;
  return kOnednnBuilt ? Bf16Backend::kOnednn : Bf16Backend::kFallback;
}

// Why oneDNN, chosen, runs nothing (set once, before g_backend turns kFallback); "" otherwise.
std::string g_onednn_error;

std::atomic<Bf16Backend> g_backend{Bf16Backend::kNone};
std::mutex g_choose_mutex;

[[maybe_unused]] Bf16Backend Active() {  // unused where neither oneMKL nor oneDNN is built in (aarch64)
  Bf16Backend backend = g_backend.load(std::memory_order_acquire);
  if (backend == Bf16Backend::kNone) {
    if (!ChooseBf16Gemm().empty()) {
      std::lock_guard<std::mutex> lock(g_choose_mutex);
      Bf16Backend expected = Bf16Backend::kNone;
      g_backend.compare_exchange_strong(expected, Automatic(), std::memory_order_acq_rel);
    }
    backend = g_backend.load(std::memory_order_acquire);
  }
#if defined(ORTLSTM_ONEDNN)
  if (backend == Bf16Backend::kOnednn && !onednn::LoadError().empty()) {
    // libdnnl is loaded here, at the first bf16 GEMM: float32 users never load it.
    std::lock_guard<std::mutex> lock(g_choose_mutex);
    if (g_onednn_error.empty()) g_onednn_error = onednn::LoadError();
    g_backend.store(Bf16Backend::kFallback, std::memory_order_release);
    backend = Bf16Backend::kFallback;
  }
#endif
  return backend;
}

// Once per process, the first time a bf16 GEMM runs on the fallback, saying why it is there.
// (An atomic flag rather than std::call_once: pthread_once would raise the wheels' manylinux tag to 2_34.)
void WarnSlowFallback() {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  {
    const char* forced = std::getenv(kEnvironmentVariable);
    const std::string why = !g_onednn_error.empty() ? "oneDNN did not load: " + g_onednn_error
                            : forced != nullptr && forced[0] != '\0' ? std::string(kEnvironmentVariable) + "=fallback"
                            : !CpuHasBf16Units() ? std::string("a CPU without bf16 units (no AVX512-BF16 or AMX)")
                                                 : "an " + CpuVendor() + " CPU: oneMKL does not use its bf16 units";
    std::fprintf(stderr,
                 "ortlstm: warning: matmul_precision=\"bfloat16\" runs on the fallback GEMM (%s): bfloat16 operands "
                 "widened to float32 and the float32 GEMM, the same numbers but slower than "
                 "matmul_precision=\"float32\"\n",
                 why.c_str());
  }
}

#if defined(ORTLSTM_ONEDNN)
// Once per process, if oneDNN refuses a GEMM (a primitive it cannot create or run): that GEMM takes
// the fallback, the same numbers within summation order.
void WarnOnednnRefused(int64_t m, int64_t n, int64_t k) {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  {
    std::fprintf(stderr,
                 "ortlstm: warning: oneDNN refused a bf16 GEMM (M %lld, N %lld, K %lld); it and any other it refuses "
                 "run on the fallback GEMM (the same numbers, slower)\n",
                 static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k));
  }
}
#endif

[[maybe_unused]] int Int(int64_t value) {
  assert(value >= 0 && value <= INT_MAX);
  return static_cast<int>(value);
}

inline uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// RNE on the bits: add 0x7FFF plus the lowest kept bit, keep the upper half; NaN keeps its upper
// half with the quiet bit set (so a NaN whose payload lies in the low half stays NaN).
inline uint16_t RoundBits(uint32_t bits) {
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

// op(X) stored as `rows` x `cols` with leading dimension `ld`, converted densely (ld = cols).
template <typename In, typename Out, typename Convert>
Out* Dense(const In* x, int64_t rows, int64_t cols, int64_t ld, std::vector<Out>* buffer, Convert convert) {
  buffer->resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) convert(x + r * ld, buffer->data() + r * cols, cols);
  return buffer->data();
}

// Per-thread scratch for the rounded operands: A and B of a GEMM (0, 1), and of ParallelGemmRoundedBf16's
// calling thread (2, 3), which its tasks read while that thread may run a GEMM of its own.
[[maybe_unused]] std::vector<Bfloat16>& Bf16Scratch(int which) {
  thread_local std::vector<Bfloat16> buffers[4];
  return buffers[which];
}
std::vector<float>& FloatScratch(int which) {
  thread_local std::vector<float> buffers[2];
  return buffers[which];
}

// What the calling thread's Bf16Scratch(2) holds, for Bf16ReuseLeftOperand: the rounded copy of
// `rows` x `cols` floats at `source` (leading dimension `ld`), valid while `valid` and a scope lives.
struct RoundedLeft {
  int scopes = 0;
  bool valid = false;
  uintptr_t source = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
};
RoundedLeft& ThreadRoundedLeft() {
  thread_local RoundedLeft rounded;
  return rounded;
}

// Where A [rows, cols] (leading dimension ld) starts in the copy RoundedLeft describes, or nullptr if
// no scope is open or A does not lie inside that copy.
const Bfloat16* ReusableLeft(const float* a, int64_t rows, int64_t cols, int64_t ld) {
  const RoundedLeft& held = ThreadRoundedLeft();
  if (held.scopes == 0 || !held.valid || ld != held.ld || cols != held.cols) return nullptr;
  const auto address = reinterpret_cast<uintptr_t>(a);
  const uintptr_t stride = static_cast<uintptr_t>(ld) * sizeof(float);
  if (address < held.source || (address - held.source) % stride != 0) return nullptr;
  const auto first = static_cast<int64_t>((address - held.source) / stride);
  if (first + rows > held.rows) return nullptr;
  return Bf16Scratch(2).data() + first * cols;
}

// A [a_rows, a_cols] and B rounded densely (ld = cols) into *a_out (none if a_rows is 0) and *b_out, cut into `parts`
// blocks of rows rounded by that many executor tasks: in one thread, rounding the operands of the
// backward's window GEMMs (dpre [rows, 4H] once for each of dW, dR, dX) left the other threads
// idle for ~5 % of an op call at M (issue 33). The buffers are the calling thread's scratch, kept
// across calls: a fresh vector per call paid its page faults every time.
void RoundInParallel(const Executor& executor, int64_t parts, const float* a, int64_t a_rows, int64_t a_cols,
                     int64_t lda, std::vector<Bfloat16>* a_out, const float* b, int64_t b_rows, int64_t b_cols,
                     int64_t ldb, std::vector<Bfloat16>* b_out) {
  if (a_out != nullptr) a_out->resize(static_cast<size_t>(a_rows * a_cols));
  b_out->resize(static_cast<size_t>(b_rows * b_cols));
  Bfloat16* a_to = a_out != nullptr ? a_out->data() : nullptr;  // (a_rows 0 then)
  Bfloat16* b_to = b_out->data();
  const auto round = [&](size_t index) {
    const Range ra = SplitRange(a_rows, parts, static_cast<int64_t>(index));
    for (int64_t r = ra.begin; r < ra.end; ++r) RoundToBfloat16(a + r * lda, a_to + r * a_cols, a_cols);
    const Range rb = SplitRange(b_rows, parts, static_cast<int64_t>(index));
    for (int64_t r = rb.begin; r < rb.end; ++r) RoundToBfloat16(b + r * ldb, b_to + r * b_cols, b_cols);
  };
  if (parts == 1) {
    round(0);
  } else {
    executor.For(static_cast<size_t>(parts), round);
  }
}

bool ScaleOnly(int64_t m, int64_t n, int64_t k, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return true;
  if (k != 0) return false;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
  }
  return true;
}

constexpr std::align_val_t kPackedAlignment{64};

}  // namespace

std::string ParseMatmulPrecision(const std::string& value, MatmulPrecision* precision) {
  if (value == "float32") {
    *precision = MatmulPrecision::kFloat32;
  } else if (value == "bfloat16") {
    *precision = MatmulPrecision::kBfloat16;
  } else {
    return "attribute matmul_precision: expected float32 or bfloat16, got '" + value + "'";
  }
  return "";
}

bool CpuHasBf16Units() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__builtin_cpu_supports("avx512f")) return false;  // also says the OS saves the AVX-512 state
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool amx_bf16 = (edx >> 22) & 1u;
    const unsigned int max_subleaf = eax;
    bool avx512_bf16 = false;
    if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0) avx512_bf16 = (eax >> 5) & 1u;
    return avx512_bf16 || amx_bf16;
  }();
  return has;
#else
  return false;
#endif
}

ORTLSTM_ROUND_CLONES void RoundToBfloat16(const float* src, Bfloat16* dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = RoundBits(Bits(src[i]));
}

ORTLSTM_ROUND_CLONES void RoundToBfloat16AsFloat(const float* src, float* dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t widened = static_cast<uint32_t>(RoundBits(Bits(src[i]))) << 16;
    std::memcpy(dst + i, &widened, sizeof widened);
  }
}

ORTLSTM_ROUND_CLONES void Bfloat16ToFloat(const Bfloat16* src, float* dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t widened = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &widened, sizeof widened);
  }
}

std::string ChooseBf16Gemm() {
  const char* forced = std::getenv(kEnvironmentVariable);
  Bf16Backend wanted = Automatic();
  if (forced != nullptr && forced[0] != '\0') {
    const std::string value(forced);
    if (value == "mkl") {
      wanted = Bf16Backend::kMkl;
    } else if (value == "onednn") {
      wanted = Bf16Backend::kOnednn;
    } else if (value == "fallback") {
      wanted = Bf16Backend::kFallback;
    } else {
      return std::string(kEnvironmentVariable) + "='" + value +
             "' is not a bf16 GEMM backend: expected mkl, onednn or fallback, or unset for the choice by CPU";
    }
    if (wanted == Bf16Backend::kMkl && !kMklLinked) {
      return std::string(kEnvironmentVariable) +
             "=mkl, but this build of ortlstm does not link oneMKL (see cmake/Blas.cmake); use onednn or fallback";
    }
    if (wanted == Bf16Backend::kOnednn && !kOnednnBuilt) {
      return std::string(kEnvironmentVariable) +
             "=onednn, but this build of ortlstm has no oneDNN backend (see cmake/Onednn.cmake); use fallback";
    }
  }
  std::lock_guard<std::mutex> lock(g_choose_mutex);
  const Bf16Backend current = g_backend.load(std::memory_order_acquire);
  if (current == Bf16Backend::kNone) {
    g_backend.store(wanted, std::memory_order_release);
  } else if (current != wanted && forced != nullptr && forced[0] != '\0') {
    return std::string(kEnvironmentVariable) + "=" + Name(wanted) + ", but this process already runs bf16 GEMMs on " +
           Name(current) + " (chosen once per process)";
  }
  return "";
}

const char* Bf16GemmBackendName() {
  if (g_backend.load(std::memory_order_acquire) == Bf16Backend::kNone && !ChooseBf16Gemm().empty()) return nullptr;
  return Name(Active());  // onednn is "fallback" here if libdnnl does not load (tried now)
}

void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const Bfloat16* a,
              int64_t lda, const Bfloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (ScaleOnly(m, n, k, beta, c, ldc)) return;
#if defined(ORTLSTM_BLAS_MKL)
  if (Active() == Bf16Backend::kMkl) {
    blas_backend::MklGemmBf16(trans_a, trans_b, Int(m), Int(n), Int(k), alpha, a, Int(lda), b, Int(ldb), beta, c,
                              Int(ldc));
    return;
  }
#endif
#if defined(ORTLSTM_ONEDNN)
  if (Active() == Bf16Backend::kOnednn) {
    if (onednn::Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
    WarnOnednnRefused(m, n, k);
  } else {
    WarnSlowFallback();
  }
#else
  WarnSlowFallback();
#endif
  const float* a_wide = Dense(a, trans_a ? k : m, trans_a ? m : k, lda, &FloatScratch(0), Bfloat16ToFloat);
  const float* b_wide = Dense(b, trans_b ? n : k, trans_b ? k : n, ldb, &FloatScratch(1), Bfloat16ToFloat);
  Gemm(trans_a, trans_b, m, n, k, alpha, a_wide, trans_a ? m : k, b_wide, trans_b ? k : n, beta, c, ldc);
}

void GemmRoundedBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (ScaleOnly(m, n, k, beta, c, ldc)) return;
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
#if defined(ORTLSTM_BLAS_MKL)
  if (Active() == Bf16Backend::kMkl) {
    const Bfloat16* a_bf16 = Dense(a, a_rows, a_cols, lda, &Bf16Scratch(0), RoundToBfloat16);
    const Bfloat16* b_bf16 = Dense(b, b_rows, b_cols, ldb, &Bf16Scratch(1), RoundToBfloat16);
    blas_backend::MklGemmBf16(trans_a, trans_b, Int(m), Int(n), Int(k), alpha, a_bf16, Int(a_cols), b_bf16,
                              Int(b_cols), beta, c, Int(ldc));
    return;
  }
#endif
#if defined(ORTLSTM_ONEDNN)
  if (Active() == Bf16Backend::kOnednn) {
    const Bfloat16* a_bf16 = Dense(a, a_rows, a_cols, lda, &Bf16Scratch(0), RoundToBfloat16);
    const Bfloat16* b_bf16 = Dense(b, b_rows, b_cols, ldb, &Bf16Scratch(1), RoundToBfloat16);
    if (onednn::Gemm(trans_a, trans_b, m, n, k, alpha, a_bf16, a_cols, b_bf16, b_cols, beta, c, ldc)) return;
    WarnOnednnRefused(m, n, k);
  } else {
    WarnSlowFallback();
  }
#else
  WarnSlowFallback();
#endif
  const float* a_wide = Dense(a, a_rows, a_cols, lda, &FloatScratch(0), RoundToBfloat16AsFloat);
  const float* b_wide = Dense(b, b_rows, b_cols, ldb, &FloatScratch(1), RoundToBfloat16AsFloat);
  Gemm(trans_a, trans_b, m, n, k, alpha, a_wide, a_cols, b_wide, b_cols, beta, c, ldc);
}

void ParallelGemmRoundedBf16(const Executor& executor, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                             float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                             float* c, int64_t ldc) {
  if (ScaleOnly(m, n, k, beta, c, ldc)) return;
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  const Bf16Backend backend = Active();
  if (backend == Bf16Backend::kMkl || backend == Bf16Backend::kOnednn) {
    // Rounded here, once, by the same tasks; the blocks are ParallelGemm's (rows of C when m >= n,
    // else columns), each one single-threaded GemmBf16 in its task (oneMKL's, or oneDNN's in the
    // calling thread alone).
    constexpr int64_t kMinBlockWork = int64_t{1} << 18;  // as ParallelGemm's
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(executor.Width(), (m * n * k) / kMinBlockWork));
    // A as the previous call of an open Bf16ReuseLeftOperand rounded it, else rounded now.
    const Bfloat16* a_bf16 = ReusableLeft(a, a_rows, a_cols, lda);
    std::vector<Bfloat16>& b_bf16 = Bf16Scratch(3);
    if (a_bf16 != nullptr) {
      RoundInParallel(executor, parts, a, 0, a_cols, lda, nullptr, b, b_rows, b_cols, ldb, &b_bf16);
    } else {
      RoundedLeft& held = ThreadRoundedLeft();
      RoundInParallel(executor, parts, a, a_rows, a_cols, lda, &Bf16Scratch(2), b, b_rows, b_cols, ldb, &b_bf16);
      held = RoundedLeft{held.scopes, true, reinterpret_cast<uintptr_t>(a), a_rows, a_cols, lda};
      a_bf16 = Bf16Scratch(2).data();
    }
    const bool split_rows = m >= n;
    const int64_t extent = split_rows ? m : n;
    const int64_t blocks = std::min(parts, extent);
    executor.For(static_cast<size_t>(blocks), [&](size_t index) {
      const Range r = SplitRange(extent, blocks, static_cast<int64_t>(index));
      if (r.end == r.begin) return;
      const Bfloat16* a_block = split_rows ? (trans_a ? a_bf16 + r.begin : a_bf16 + r.begin * a_cols) : a_bf16;
      const Bfloat16* b_block = split_rows ? b_bf16.data()
                                           : (trans_b ? b_bf16.data() + r.begin * b_cols : b_bf16.data() + r.begin);
      const int64_t rows = split_rows ? r.end - r.begin : m, cols = split_rows ? n : r.end - r.begin;
      float* c_block = split_rows ? c + r.begin * ldc : c + r.begin;
      GemmBf16(trans_a, trans_b, rows, cols, k, alpha, a_block, a_cols, b_block, b_cols, beta, c_block, ldc);
    });
    return;
  }
  WarnSlowFallback();
  std::vector<float> a_wide, b_wide;
  Dense(a, a_rows, a_cols, lda, &a_wide, RoundToBfloat16AsFloat);
  Dense(b, b_rows, b_cols, ldb, &b_wide, RoundToBfloat16AsFloat);
  ParallelGemm(executor, trans_a, trans_b, m, n, k, alpha, a_wide.data(), a_cols, b_wide.data(), b_cols, beta, c, ldc);
}

#if defined(ORTLSTM_ONEDNN)
namespace {

// C[M, N] = beta * C + product[M, N] (dense), row by row; beta 0 ignores C's values, as a GEMM does.
ORTLSTM_ROUND_CLONES void AddProduct(const float* product, int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    const float* p = product + i * n;
    float* row = c + i * ldc;
    if (beta == 0.0f) {
      std::copy_n(p, n, row);
    } else if (beta == 1.0f) {
      for (int64_t j = 0; j < n; ++j) row[j] += p[j];
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] = beta * row[j] + p[j];
    }
  }
}

}  // namespace
#endif

Bf16ReuseLeftOperand::Bf16ReuseLeftOperand() : outer_(ThreadRoundedLeft().scopes == 0) {
  RoundedLeft& held = ThreadRoundedLeft();
  ++held.scopes;
  if (outer_) held.valid = false;  // a copy rounded before the scope opened is not trusted
}

Bf16ReuseLeftOperand::~Bf16ReuseLeftOperand() {
  RoundedLeft& held = ThreadRoundedLeft();
  --held.scopes;
  if (held.scopes == 0) held.valid = false;
}

void Bf16Operand::Free::operator()(void* p) const { ::operator delete(p, kPackedAlignment); }

Bf16Operand::~Bf16Operand() = default;

Bf16Operand::Bf16Operand(bool trans_b, int64_t m, int64_t n, int64_t k, const float* b, int64_t ldb)
    : trans_b_(trans_b), m_(m), n_(n), k_(k) {
  const int64_t rows = trans_b ? n : k, cols = trans_b ? k : n;
#if defined(ORTLSTM_ONEDNN)
  if (Active() == Bf16Backend::kOnednn) {
    // The plain bfloat16 copy stays for row counts the packed layout refuses; B packed once here.
    Dense(b, rows, cols, ldb, &b_bf16_, RoundToBfloat16);
    auto packed = std::make_shared<onednn::PackedB>(trans_b, m, n, k, b_bf16_.data(), cols);
    if (packed->ok()) onednn_ = std::move(packed);
    onednn_backend_ = true;
    return;
  }
#endif
#if defined(ORTLSTM_BLAS_MKL)
  if (Active() == Bf16Backend::kMkl) {
    Dense(b, rows, cols, ldb, &b_bf16_, RoundToBfloat16);
    if (m > 0 && n > 0 && k > 0) {
      packed_.reset(::operator new(blas_backend::MklPackedSizeBf16(Int(m), Int(n), Int(k)), kPackedAlignment));
      blas_backend::MklPackBf16(trans_b, Int(m), Int(n), Int(k), b_bf16_.data(), Int(cols), packed_.get());
    }
    return;
  }
#endif
  Dense(b, rows, cols, ldb, &b_rounded_, RoundToBfloat16AsFloat);
}

void Bf16Operand::Multiply(const float* a, int64_t lda, float beta, float* c, int64_t ldc, float alpha,
                           int64_t m) const {
  if (m < 0) m = m_;
  assert(m <= m_);
  if (ScaleOnly(m, n_, k_, beta, c, ldc)) return;
  const int64_t b_cols = trans_b_ ? k_ : n_;
#if defined(ORTLSTM_ONEDNN)
  if (onednn_backend_) {
    const Bfloat16* a_bf16 = Dense(a, m, k_, lda, &Bf16Scratch(0), RoundToBfloat16);
    if (onednn_ != nullptr && ldc != n_) {
      // A strided C (a task's block of the gates row, with blocks of hidden units): oneDNN's brgemm
      // ran it ~19 % slower than into a dense C (L's step, 64 x 1024 x 512: 382 vs 321 us), so the
      // product goes to dense scratch and is added into C here, beta * C + product.
      std::vector<float>& product = FloatScratch(0);
      product.resize(static_cast<size_t>(m * n_));
      if (onednn_->Multiply(a_bf16, k_, m, alpha, 0.0f, product.data(), n_)) {
        AddProduct(product.data(), m, n_, beta, c, ldc);
        return;
      }
    }
    if (onednn_ != nullptr && ldc == n_ && onednn_->Multiply(a_bf16, k_, m, alpha, beta, c, ldc)) return;
    GemmBf16(false, trans_b_, m, n_, k_, alpha, a_bf16, k_, b_bf16_.data(), b_cols, beta, c, ldc);
    return;
  }
#endif
#if defined(ORTLSTM_BLAS_MKL)
  if (!b_bf16_.empty()) {
    const Bfloat16* a_bf16 = Dense(a, m, k_, lda, &Bf16Scratch(0), RoundToBfloat16);
    if (packed_ && m == m_) {
      blas_backend::MklComputeBf16(Int(m), Int(n_), Int(k_), alpha, a_bf16, Int(k_), packed_.get(), beta, c,
                                   Int(ldc));
    } else {
      blas_backend::MklGemmBf16(false, trans_b_, Int(m), Int(n_), Int(k_), alpha, a_bf16, Int(k_), b_bf16_.data(),
                                Int(b_cols), beta, c, Int(ldc));
    }
    return;
  }
#endif
  WarnSlowFallback();
  const float* a_wide = Dense(a, m, k_, lda, &FloatScratch(0), RoundToBfloat16AsFloat);
  Gemm(false, trans_b_, m, n_, k_, alpha, a_wide, k_, b_rounded_.data(), b_cols, beta, c, ldc);
}

}  // namespace ortlstm
