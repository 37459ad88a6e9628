// See vector_loops.h. target_clones needs an ELF platform with ifunc (glibc); elsewhere the
// loops are built once for the baseline.
#include "lstm/vector_loops.h"

#include "lstm/fast_math.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && !defined(__clang__)
#define ORTLSTM_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ORTLSTM_VECTOR_CLONES
#endif

namespace ortlstm {

ORTLSTM_VECTOR_CLONES void SigmoidInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = SigmoidFloat(x[i]);
}

ORTLSTM_VECTOR_CLONES void TanhInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = TanhFloat(x[i]);
}

ORTLSTM_VECTOR_CLONES void TanhDerivatives(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float y = TanhFloat(x[i]);
    out[i] = 1.0f - y * y;
  }
}

namespace {

// GCC honours __restrict on parameters, not on local copies: the loop lives here, inlined into
// each clone below.
inline __attribute__((always_inline)) void StandardCellLoop(
    const float* __restrict pre_i, const float* __restrict pre_o, const float* __restrict pre_f,
    const float* __restrict pre_c, const float* __restrict bias_i, const float* __restrict bias_o,
    const float* __restrict bias_f, const float* __restrict bias_c, float* __restrict gi, float* __restrict go,
    float* __restrict gf, float* __restrict gc, float* __restrict cell, float* __restrict hidden, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float i = SigmoidFloat(pre_i[j] + bias_i[j]);
    const float f = SigmoidFloat(pre_f[j] + bias_f[j]);
    const float g = TanhFloat(pre_c[j] + bias_c[j]);
    const float c = f * cell[j] + i * g;
    const float o = SigmoidFloat(pre_o[j] + bias_o[j]);
    gi[j] = i;
    go[j] = o;
    gf[j] = f;
    gc[j] = g;
    cell[j] = c;
    hidden[j] = TanhFloat(c) * o;
  }
}

template <bool kHasGradHAll>
inline __attribute__((always_inline)) void StandardCellGradLoop(
    const float* __restrict gi, const float* __restrict go, const float* __restrict gf, const float* __restrict gc,
    const float* __restrict cell, const float* __restrict cell_prev, const float* __restrict grad_hall,
    float* __restrict grad_h, float* __restrict grad_c, float* __restrict dpre_i, float* __restrict dpre_o,
    float* __restrict dpre_f, float* __restrict dpre_c, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float dh = kHasGradHAll ? grad_h[j] + grad_hall[j] : grad_h[j];
    const float i = gi[j];
    const float o = go[j];
    const float f = gf[j];
    const float g = gc[j];
    const float h_of_c = TanhFloat(cell[j]);
    // Ht = o . tanh(Ct)
    dpre_o[j] = dh * h_of_c * (o * (1.0f - o));
    const float dc = grad_c[j] + dh * o * (1.0f - h_of_c * h_of_c);
    // Ct = f . Ct-1 + i . g
    dpre_i[j] = dc * g * (i * (1.0f - i));
    dpre_f[j] = dc * cell_prev[j] * (f * (1.0f - f));
    dpre_c[j] = dc * i * (1.0f - g * g);
    grad_c[j] = dc * f;
    grad_h[j] = 0.0f;
  }
}

}  // namespace

ORTLSTM_VECTOR_CLONES void StandardCellBackward(const StandardCellGradRow& row, int64_t n) {
  if (row.grad_hall != nullptr) {
    StandardCellGradLoop<true>(row.gate[0], row.gate[1], row.gate[2], row.gate[3], row.cell, row.cell_prev,
                               row.grad_hall, row.grad_h, row.grad_c, row.grad_pre[0], row.grad_pre[1],
                               row.grad_pre[2], row.grad_pre[3], n);
  } else {
    StandardCellGradLoop<false>(row.gate[0], row.gate[1], row.gate[2], row.gate[3], row.cell, row.cell_prev,
                                nullptr, row.grad_h, row.grad_c, row.grad_pre[0], row.grad_pre[1], row.grad_pre[2],
                                row.grad_pre[3], n);
  }
}

ORTLSTM_VECTOR_CLONES void StandardCellForward(const StandardCellRow& row, int64_t n) {
  StandardCellLoop(row.pre, row.pre + n, row.pre + 2 * n, row.pre + 3 * n, row.bias, row.bias + n, row.bias + 2 * n,
                   row.bias + 3 * n, row.gate[0], row.gate[1], row.gate[2], row.gate[3], row.cell, row.hidden, n);
}

}  // namespace ortlstm
