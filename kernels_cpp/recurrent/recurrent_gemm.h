// The GEMMs of the recurrent ops (LSTM, GRU, RNN; forward driver and backward files) under the
// op's matmul_precision (issue 33): float32 runs the GEMMs of common/blas.h exactly as before
// (bitwise the same results), bfloat16 the drop-ins of common/bf16_gemm.h, whose operands are
// rounded to bfloat16 (round to nearest even) and accumulated in float32. One branch here rather
// than at every call site, so that a call site reads as before with the precision in front.
// bfloat16 applies to float tensors only: the ORT adapters refuse it on float64 (float64 is for
// gradient checks), so the double instantiations always take the float32 path.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/bf16_gemm.h"
#include "common/blas.h"

namespace ortlstm {

// Whether `precision` asks for bf16 GEMMs and T can run them.
template <typename T>
constexpr bool UsesBf16(MatmulPrecision precision) {
  return std::is_same_v<T, float> && precision == MatmulPrecision::kBfloat16;
}

// ParallelGemm of common/blas.h, or ParallelGemmRoundedBf16 (alpha 1): the GEMMs over all steps
// (input projection, dX, dW, dR, the GRU's Q).
template <typename T>
void RecurrentParallelGemm(MatmulPrecision precision, const Executor& executor, bool trans_a, bool trans_b, int64_t m,
                           int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
                           int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (precision == MatmulPrecision::kBfloat16) {
      ParallelGemmRoundedBf16(executor, trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
      return;
    }
  }
  ParallelGemm(executor, trans_a, trans_b, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
}

// The right operand op(B) [K, N] of a per-step GEMM C[M, N] = A[M, K] * op(B) + beta * C, built
// once per task and op call, never per step: float32 keeps today's GEMM (PackedGemmB where the
// call site packed, else Gemm straight from B, which must then outlive this object), bfloat16 a
// Bf16Operand (B rounded, and packed where the backend can, once).
template <typename T>
class StepOperand {
 public:
  StepOperand() = default;
  StepOperand(MatmulPrecision precision, bool pack, bool trans_b, int64_t m, int64_t n, int64_t k, const T* b,
              int64_t ldb)
      : bf16_(UsesBf16<T>(precision)), pack_(pack), trans_b_(trans_b), n_(n), k_(k), b_(b), ldb_(ldb) {
    if constexpr (std::is_same_v<T, float>) {
      if (bf16_) {
        bf16_operand_ = Bf16Operand(trans_b, m, n, k, b, ldb);
        return;
      }
    }
    if (pack_) packed_ = PackedGemmB<T>(trans_b, m, n, k, b, ldb);
  }

  // C[m, N] = A[m, K] * op(B) + beta * C, m = the constructor's M (a packed float32 operand) or
  // any m up to it.
  void Multiply(const T* a, int64_t lda, T beta, T* c, int64_t ldc, int64_t m) const {
    if constexpr (std::is_same_v<T, float>) {
      if (bf16_) {
        bf16_operand_.Multiply(a, lda, beta, c, ldc, 1.0f, m);
        return;
      }
    }
    if (pack_) {
      packed_.Multiply(a, lda, beta, c, ldc);
    } else {
      Gemm(false, trans_b_, m, n_, k_, T(1), a, lda, b_, ldb_, beta, c, ldc);
    }
  }

 private:
  bool bf16_ = false;
  bool pack_ = false;
  bool trans_b_ = false;
  int64_t n_ = 0;
  int64_t k_ = 0;
  const T* b_ = nullptr;
  int64_t ldb_ = 0;
  PackedGemmB<T> packed_;
  Bf16Operand bf16_operand_;  // used for T = float only
};

}  // namespace ortlstm
