// See standard_cell.h. target_clones needs an ELF platform with ifunc (glibc); elsewhere the
// loops are built once for the baseline.
#include "lstm/standard_cell.h"

#include "lstm/fast_math.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && !defined(__clang__)
// arch=haswell: AVX2 with FMA, which the contraction needs (the avx2 flag alone leaves FMA out).
#define ORTLSTM_CELL_CLONES __attribute__((target_clones("avx512f", "arch=haswell", "default")))
#else
#define ORTLSTM_CELL_CLONES
#endif

namespace ortlstm {

namespace {

// GCC honours __restrict on parameters, not on local copies: the loop lives here, inlined into
// each clone below.
// The four gates of one row: out_x[j] = act(pre_x[j] + bias_x[j]).
inline __attribute__((always_inline)) void GateLoop(
    const float* __restrict pre_i, const float* __restrict pre_o, const float* __restrict pre_f,
    const float* __restrict pre_c, const float* __restrict bias_i, const float* __restrict bias_o,
    const float* __restrict bias_f, const float* __restrict bias_c, float* __restrict gi, float* __restrict go,
    float* __restrict gf, float* __restrict gc, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    gi[j] = SigmoidFloat(pre_i[j] + bias_i[j]);
    gf[j] = SigmoidFloat(pre_f[j] + bias_f[j]);
    gc[j] = TanhFloat(pre_c[j] + bias_c[j]);
    go[j] = SigmoidFloat(pre_o[j] + bias_o[j]);
  }
}

// The same in place: x[j] = act(x[j] + bias_x[j]).
inline __attribute__((always_inline)) void GateLoopInPlace(float* __restrict gi, float* __restrict go,
                                                           float* __restrict gf, float* __restrict gc,
                                                           const float* __restrict bias_i,
                                                           const float* __restrict bias_o,
                                                           const float* __restrict bias_f,
                                                           const float* __restrict bias_c, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    gi[j] = SigmoidFloat(gi[j] + bias_i[j]);
    gf[j] = SigmoidFloat(gf[j] + bias_f[j]);
    gc[j] = TanhFloat(gc[j] + bias_c[j]);
    go[j] = SigmoidFloat(go[j] + bias_o[j]);
  }
}

// Ct = f . Ct-1 + i . g, Ht = o . tanh(Ct) from the activated gates.
inline __attribute__((always_inline)) void StateLoop(const float* __restrict gi, const float* __restrict go,
                                                     const float* __restrict gf, const float* __restrict gc,
                                                     float* __restrict cell, float* __restrict hidden, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float c = gf[j] * cell[j] + gi[j] * gc[j];
    cell[j] = c;
    hidden[j] = TanhFloat(c) * go[j];
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

ORTLSTM_CELL_CLONES void StandardCellBackward(const StandardCellGradRow& row, int64_t n) {
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

// Two passes: the four independent gates, then the state update, whose tanh(Ct) waits on them.
// In one pass the chain i/f/g -> Ct -> tanh(Ct) is too long for the core to overlap iterations
// (16 rows x 256 units, in cache: 16.4 us one pass, 14.6 us two, 10 us two with FMA, 6.2 us
// with the gate activations free of range selects, lstm/fast_math.h).
ORTLSTM_CELL_CLONES void StandardCellForward(const StandardCellRow& row, int64_t n) {
  float* pre = row.pre;
  const float* bias = row.bias;
  float* const* gate = row.gate;
  if (gate[0] == nullptr) {
    GateLoopInPlace(pre, pre + n, pre + 2 * n, pre + 3 * n, bias, bias + n, bias + 2 * n, bias + 3 * n, n);
    StateLoop(pre, pre + n, pre + 2 * n, pre + 3 * n, row.cell, row.hidden, n);
  } else {
    GateLoop(pre, pre + n, pre + 2 * n, pre + 3 * n, bias, bias + n, bias + 2 * n, bias + 3 * n, gate[0], gate[1],
             gate[2], gate[3], n);
    StateLoop(gate[0], gate[1], gate[2], gate[3], row.cell, row.hidden, n);
  }
}

}  // namespace ortlstm
