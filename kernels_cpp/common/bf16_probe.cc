// The bf16 GEMM layer as C functions, for tests and benchmarks through ctypes (tests/test_bf16_gemm.py,
// benchmarks/bench_gemm.py), as OrtLstmBlasBackend is for the float32 backend; they need no ONNX
// Runtime. Exported by cmake/ortlstm_ops.map; no kernel calls them.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/bf16_gemm.h"
#include "common/blas.h"

// "mkl" or "fallback": the bf16 GEMM backend of this process (ORTLSTM_BF16_GEMM or the CPU's
// choice, fixed from the first call on); NULL if ORTLSTM_BF16_GEMM names none this build has.
extern "C" __attribute__((visibility("default"))) const char* OrtLstmBf16GemmBackend(void) {
  return ortlstm::Bf16GemmBackendName();
}

// 1 if the CPU has AVX512-BF16 or AMX-BF16.
extern "C" __attribute__((visibility("default"))) int OrtLstmCpuHasBf16Units(void) {
  return ortlstm::CpuHasBf16Units() ? 1 : 0;
}

// dst[i] = round_to_nearest_even_bf16(src[i]) (the bits).
extern "C" __attribute__((visibility("default"))) void OrtLstmRoundToBfloat16(const float* src, uint16_t* dst,
                                                                                int64_t count) {
  ortlstm::RoundToBfloat16(src, dst, count);
}

namespace {
// An executor of width 3 that runs its tasks one after another: ParallelGemmRoundedBf16's blocks as
// with three threads, deterministic.
struct ThreeTasks final : ortlstm::Executor {
  void For(std::size_t count, const std::function<void(std::size_t)>& task) const override {
    for (std::size_t i = 0; i < count; ++i) task(i);
  }
  int Width() const override { return 3; }
};
}  // namespace

// C = alpha * op(round(A)) * op(round(B)) + beta * C through the bf16 layer, by `mode`:
//   0 GemmRoundedBf16;
//   1 GemmBf16 with A and B given as bfloat16 bits (uint16, leading dimensions in elements);
//   2 a Bf16Operand of B (trans_a must be 0) multiplied twice, into a copy of C and then into C
//     (so a packed operand is reused);
//   3 the float32 Gemm of common/blas.h on the operands as given (the float32 limit, for benchmarks);
//   4 ParallelGemmRoundedBf16 cut into blocks for three tasks (run one after another);
//   5 a Bf16Operand of B multiplied kSteps times into C (a time loop's step GEMM, its construction
//     amortized as in one op call);
//   6 a Bf16Operand built for m + 7 rows multiplied with m (the last steps of variable-length sequences);
//   7 mode 4 twice in one Bf16ReuseLeftOperand scope, on a copy of A that is doubled between the calls
//     (a broken promise, to show the reuse): C gets the second call's product, that of A as given.
// Returns 0, or -1 for a mode or transpose it does not take.
extern "C" __attribute__((visibility("default"))) int OrtLstmGemmBf16(int mode, int trans_a, int trans_b, int64_t m,
                                                                       int64_t n, int64_t k, float alpha,
                                                                       const float* a, int64_t lda, const float* b,
                                                                       int64_t ldb, float beta, float* c,
                                                                       int64_t ldc) {
  using namespace ortlstm;
  switch (mode) {
    case 0:
      GemmRoundedBf16(trans_a != 0, trans_b != 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return 0;
    case 1:  // a and b hold bfloat16 bits already (OrtLstmRoundToBfloat16): the GEMM alone
      GemmBf16(trans_a != 0, trans_b != 0, m, n, k, alpha, reinterpret_cast<const Bfloat16*>(a), lda,
               reinterpret_cast<const Bfloat16*>(b), ldb, beta, c, ldc);
      return 0;
    case 2: {
      if (trans_a != 0) return -1;
      const Bf16Operand operand(trans_b != 0, m, n, k, b, ldb);
      std::vector<float> first(static_cast<size_t>(m * ldc));
      for (int64_t i = 0; i < m * ldc; ++i) first[static_cast<size_t>(i)] = c[i];
      operand.Multiply(a, lda, beta, first.data(), ldc, alpha);
      operand.Multiply(a, lda, beta, c, ldc, alpha);
      return 0;
    }
    case 4: {  // ParallelGemmRoundedBf16 over three serial tasks (blocks as with three threads)
      ParallelGemmRoundedBf16(ThreeTasks(), trans_a != 0, trans_b != 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return 0;
    }
    case 7: {
      const int64_t a_rows = trans_a != 0 ? k : m;
      std::vector<float> own(a, a + a_rows * lda);
      std::vector<float> first(c, c + m * ldc);
      const Bf16ReuseLeftOperand scope;
      ParallelGemmRoundedBf16(ThreeTasks(), trans_a != 0, trans_b != 0, m, n, k, alpha, own.data(), lda, b, ldb, beta,
                              first.data(), ldc);
      for (float& value : own) value *= 2.0f;
      ParallelGemmRoundedBf16(ThreeTasks(), trans_a != 0, trans_b != 0, m, n, k, alpha, own.data(), lda, b, ldb, beta,
                              c, ldc);
      return 0;
    }
    case 3:
      Gemm(trans_a != 0, trans_b != 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return 0;
    case 5:
    case 6: {
      if (trans_a != 0) return -1;
      constexpr int kSteps = 64;  // T of the benchmarks' config M
      const Bf16Operand operand(trans_b != 0, mode == 6 ? m + 7 : m, n, k, b, ldb);
      const std::vector<float> start(c, c + m * ldc);
      for (int step = 0; step < (mode == 5 ? kSteps : 1); ++step) {
        std::copy(start.begin(), start.end(), c);
        operand.Multiply(a, lda, beta, c, ldc, alpha, m);
      }
      return 0;
    }
    default:
      return -1;
  }
}
