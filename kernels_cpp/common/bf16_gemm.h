// bfloat16 GEMMs with float32 accumulation for matmul_precision="bfloat16" (issue 33): every
// operand is rounded to bfloat16 (round to nearest even), products are exact in float32 (8-bit
// mantissas), sums accumulate in float32. Which library runs them is chosen once per process
// (ChooseBf16Gemm, like ChooseBlas): oneMKL's cblas_gemm_bf16bf16f32 on Intel CPUs with bf16
// units (AMX, AVX512-BF16) when the build links oneMKL, else the fallback: the bfloat16 values
// widened to float32 and the float32 GEMM of common/blas.h (the same products, float32
// accumulation, so the same numbers within summation order; slower than plain float32 because of
// the conversions, hence a warning once per process). On AMD Zen 4, which has AVX512-BF16,
// oneMKL's bf16 GEMM measured no faster than the fallback (docs/benchmarks.md); oneDNN's matmul
// uses those units (common/bf16_onednn.h), so CPUs with bf16 units other than Intel's get "onednn"
// where the build has it and libdnnl loads. OpenBLAS's sbgemm is not used: the scipy-openblas32
// wheel declares scipy_cblas_sbgemm in its cblas.h but does not export it (built without
// BUILD_BFLOAT16; checked with readelf on 0.3.34).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/parallel.h"

namespace ortlstm {

namespace onednn {
class PackedB;
}  // namespace onednn

// The bits of a bfloat16: float32's upper half.
using Bfloat16 = uint16_t;

// What a GEMM op's `matmul_precision` attribute asks for.
enum class MatmulPrecision : int { kFloat32 = 0, kBfloat16 = 1 };

// "float32" or "bfloat16" -> *precision; otherwise a message naming the attribute, the value and
// the allowed ones (the caller prefixes the op).
std::string ParseMatmulPrecision(const std::string& value, MatmulPrecision* precision);

// Round to nearest even, float32 -> bfloat16, element by element; NaN stays NaN (quieted, sign
// kept), +-inf stays +-inf, values past the largest bfloat16 round to inf, denormals round as
// their bits say (no flush to zero). A branch-free loop the compiler vectorises.
void RoundToBfloat16(const float* src, Bfloat16* dst, int64_t count);
// The same rounding, the result widened back to float32 (exact): what the fallback multiplies.
void RoundToBfloat16AsFloat(const float* src, float* dst, int64_t count);
// bfloat16 -> float32 (exact).
void Bfloat16ToFloat(const Bfloat16* src, float* dst, int64_t count);

// C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C with bfloat16 operands, float32 C and
// accumulation; row-major, leading dimensions in elements, as Gemm of common/blas.h.
void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const Bfloat16* a,
              int64_t lda, const Bfloat16* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The same GEMM on float32 operands, each rounded to bfloat16 first (into per-thread scratch):
// the drop-in for Gemm at a call site whose op runs with matmul_precision="bfloat16".
void GemmRoundedBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// ParallelGemm of common/blas.h on bfloat16-rounded operands: A and B rounded once (per-thread
// scratch of the calling thread), then cut into the same blocks of C as ParallelGemm<float> cuts
// them, each block one single-threaded bf16 GEMM: for the big GEMMs of an op call (the input
// projection X W^T, the backward's dX, dW and dR), results independent of scheduling.
void ParallelGemmRoundedBf16(const Executor& executor, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                             float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                             float* c, int64_t ldc);

// While one lives in a thread, ParallelGemmRoundedBf16 calls from that thread whose left operand A
// lies inside the one the previous such call rounded (the same leading dimension and stored
// columns, rows within it) reuse that bfloat16 copy instead of rounding A again. For a caller that
// multiplies one matrix several times and promises not to change it meanwhile: the backward's
// window of dpre, the left operand of dW, dR and dX (issue 33: rounding it three times was ~5 % of a
// bf16 op call at M). A no-op for float32 GEMMs. Not to be shared across threads; nests.
class Bf16ReuseLeftOperand {
 public:
  Bf16ReuseLeftOperand();
  Bf16ReuseLeftOperand(const Bf16ReuseLeftOperand&) = delete;
  Bf16ReuseLeftOperand& operator=(const Bf16ReuseLeftOperand&) = delete;
  ~Bf16ReuseLeftOperand();

 private:
  bool outer_;  // whether this thread had no scope before this one
};

// A right operand op(B) [K, N] rounded to bfloat16 (and packed where oneMKL runs the GEMM) once,
// for GEMMs C[M, N] = alpha * A[M, K] * op(B) + beta * C that share M, N, K and B: the recurrent
// weight R of a time loop (H_{t-1} R^T every step), W of the input projection. The bf16 analogue
// of PackedGemmB<float>: construct once per op call, Multiply every step. B is copied, so it
// need not outlive this object. Multiply is const and thread-safe (A is rounded into per-thread
// scratch), and gives the same values call after call.
class Bf16Operand {
 public:
  Bf16Operand() = default;
  Bf16Operand(bool trans_b, int64_t m, int64_t n, int64_t k, const float* b, int64_t ldb);
  Bf16Operand(Bf16Operand&&) noexcept = default;
  Bf16Operand& operator=(Bf16Operand&&) noexcept = default;
  ~Bf16Operand();

  // C[M, N] = alpha * round_bf16(A)[M, K] * op(B) + beta * C; `m` may be below the constructor's
  // (the last steps of variable-length sequences) but not above it.
  void Multiply(const float* a, int64_t lda, float beta, float* c, int64_t ldc, float alpha = 1.0f,
                int64_t m = -1) const;

 private:
  struct Free {
    void operator()(void* p) const;
  };
  bool trans_b_ = false;
  int64_t m_ = 0;
  int64_t n_ = 0;
  int64_t k_ = 0;
  std::vector<Bfloat16> b_bf16_;        // op(B) as given (trans_b, ld = its columns), native backend
  std::vector<float> b_rounded_;        // the same values as float32, fallback backend
  std::unique_ptr<void, Free> packed_;  // oneMKL's packed B, or null
  bool onednn_backend_ = false;                   // b_bf16_ serves oneDNN, not oneMKL
#if defined(ORTLSTM_ONEDNN)  // (without oneDNN, no shared_ptr: its refcount would raise aarch64's manylinux tag)
  std::shared_ptr<const onednn::PackedB> onednn_;  // oneDNN's packed B, or null (it refused the shape)
#endif
};

// Chooses the bf16 GEMM backend, once per process (RegisterCustomOps calls it after ChooseBlas).
// ORTLSTM_BF16_GEMM=mkl|onednn|fallback forces one; unset or empty, the CPU decides (header comment).
// Returns "" on success, else why not (an unknown value, mkl on a build without oneMKL). Loads
// nothing: oneDNN's library is loaded at the first bf16 GEMM.
std::string ChooseBf16Gemm();

// "mkl", "onednn" or "fallback" (choosing as ChooseBf16Gemm would, and loading oneDNN if that is the
// choice: "fallback" if it does not load); nullptr if that choice fails.
const char* Bf16GemmBackendName();

// Whether the CPU has bfloat16 dot-product units (AVX512-BF16 or AMX-BF16).
bool CpuHasBf16Units();

}  // namespace ortlstm
