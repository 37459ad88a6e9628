// See standard_cell.h. target_clones needs an ELF platform with ifunc (glibc); elsewhere the
// loops are built once for the baseline: on aarch64 that has NEON (armv8-a), which the compiler
// vectorises them for (scripts/build_wheels.sh checks the disassembly).
#include "lstm/standard_cell.h"

#include "lstm/fast_math.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && !defined(__clang__)
// arch=x86-64-v3: AVX2 with FMA, which the contraction needs (the avx2 flag alone leaves FMA out).
// Not arch=haswell: its clone is chosen by __builtin_cpu_is("haswell"), i.e. on Intel Haswell-class
// CPUs only, so AMD Zen 3 ran the SSE2 default (forward cell 17 % of the forward at M there); the
// x86-64-v3 clone is chosen by the ISA level the CPU reports, whoever made it.
#define ORTLSTM_CELL_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define ORTLSTM_CELL_CLONES
#endif

namespace ortlstm {

namespace {

inline float Sigmoid(float x) { return SigmoidFloat(x); }
inline double Sigmoid(double x) { return SigmoidDouble(x); }
inline float Tanh(float x) { return TanhFloat(x); }
inline double Tanh(double x) { return TanhDouble(x); }

// GCC honours __restrict on parameters, not on local copies: the loops live here, inlined into
// each clone below.
// The four gates of one row: out_x[j] = act(pre_x[j] + bias_x[j]).
template <typename T>
inline __attribute__((always_inline)) void GateLoop(const T* __restrict pre_i, const T* __restrict pre_o,
                                                    const T* __restrict pre_f, const T* __restrict pre_c,
                                                    const T* __restrict bias_i, const T* __restrict bias_o,
                                                    const T* __restrict bias_f, const T* __restrict bias_c,
                                                    T* __restrict gi, T* __restrict go, T* __restrict gf,
                                                    T* __restrict gc, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    gi[j] = Sigmoid(pre_i[j] + bias_i[j]);
    gf[j] = Sigmoid(pre_f[j] + bias_f[j]);
    gc[j] = Tanh(pre_c[j] + bias_c[j]);
    go[j] = Sigmoid(pre_o[j] + bias_o[j]);
  }
}

// The same in place: x[j] = act(x[j] + bias_x[j]).
template <typename T>
inline __attribute__((always_inline)) void GateLoopInPlace(T* __restrict gi, T* __restrict go, T* __restrict gf,
                                                           T* __restrict gc, const T* __restrict bias_i,
                                                           const T* __restrict bias_o, const T* __restrict bias_f,
                                                           const T* __restrict bias_c, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    gi[j] = Sigmoid(gi[j] + bias_i[j]);
    gf[j] = Sigmoid(gf[j] + bias_f[j]);
    gc[j] = Tanh(gc[j] + bias_c[j]);
    go[j] = Sigmoid(go[j] + bias_o[j]);
  }
}

// Ct = f . Ct-1 + i . g, Ht = o . tanh(Ct) from the activated gates.
template <typename T>
inline __attribute__((always_inline)) void StateLoop(const T* __restrict gi, const T* __restrict go,
                                                     const T* __restrict gf, const T* __restrict gc,
                                                     T* __restrict cell, T* __restrict hidden, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const T c = gf[j] * cell[j] + gi[j] * gc[j];
    cell[j] = c;
    hidden[j] = Tanh(c) * go[j];
  }
}

template <typename T, bool kHasGradHAll>
inline __attribute__((always_inline)) void GradLoop(const T* __restrict gi, const T* __restrict go,
                                                    const T* __restrict gf, const T* __restrict gc,
                                                    const T* __restrict cell, const T* __restrict cell_prev,
                                                    const T* __restrict grad_hall, T* __restrict grad_h,
                                                    T* __restrict grad_c, T* __restrict dpre_i, T* __restrict dpre_o,
                                                    T* __restrict dpre_f, T* __restrict dpre_c, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const T dh = kHasGradHAll ? grad_h[j] + grad_hall[j] : grad_h[j];
    const T i = gi[j];
    const T o = go[j];
    const T f = gf[j];
    const T g = gc[j];
    const T h_of_c = Tanh(cell[j]);
    // Ht = o . tanh(Ct)
    dpre_o[j] = dh * h_of_c * (o * (T(1) - o));
    const T dc = grad_c[j] + dh * o * (T(1) - h_of_c * h_of_c);
    // Ct = f . Ct-1 + i . g
    dpre_i[j] = dc * g * (i * (T(1) - i));
    dpre_f[j] = dc * cell_prev[j] * (f * (T(1) - f));
    dpre_c[j] = dc * i * (T(1) - g * g);
    grad_c[j] = dc * f;
    grad_h[j] = T(0);
  }
}

template <typename T>
inline __attribute__((always_inline)) void Backward(const StandardCellGradRow<T>& row, int64_t n) {
  if (row.grad_hall != nullptr) {
    GradLoop<T, true>(row.gate[0], row.gate[1], row.gate[2], row.gate[3], row.cell, row.cell_prev, row.grad_hall,
                      row.grad_h, row.grad_c, row.grad_pre[0], row.grad_pre[1], row.grad_pre[2], row.grad_pre[3], n);
  } else {
    GradLoop<T, false>(row.gate[0], row.gate[1], row.gate[2], row.gate[3], row.cell, row.cell_prev, nullptr,
                       row.grad_h, row.grad_c, row.grad_pre[0], row.grad_pre[1], row.grad_pre[2], row.grad_pre[3], n);
  }
}

// Two passes: the four independent gates, then the state update, whose tanh(Ct) waits on them.
// In one pass the chain i/f/g -> Ct -> tanh(Ct) is too long for the core to overlap iterations
// (16 rows x 256 units, float, in cache: 16.4 us one pass, 14.6 us two, 10 us two with FMA, 6.2
// us with the gate activations free of range selects, lstm/fast_math.h).
template <typename T>
inline __attribute__((always_inline)) void Forward(const StandardCellRow<T>& row, int64_t n) {
  T* pre = row.pre;
  const T* bias = row.bias;
  T* const* gate = row.gate;
  if (gate[0] == nullptr) {
    GateLoopInPlace(pre, pre + n, pre + 2 * n, pre + 3 * n, bias, bias + n, bias + 2 * n, bias + 3 * n, n);
    StateLoop<T>(pre, pre + n, pre + 2 * n, pre + 3 * n, row.cell, row.hidden, n);
  } else {
    GateLoop<T>(pre, pre + n, pre + 2 * n, pre + 3 * n, bias, bias + n, bias + 2 * n, bias + 3 * n, gate[0], gate[1],
                gate[2], gate[3], n);
    StateLoop<T>(gate[0], gate[1], gate[2], gate[3], row.cell, row.hidden, n);
  }
}

}  // namespace

ORTLSTM_CELL_CLONES void StandardCellForward(const StandardCellRow<float>& row, int64_t n) { Forward(row, n); }
ORTLSTM_CELL_CLONES void StandardCellForward(const StandardCellRow<double>& row, int64_t n) { Forward(row, n); }
ORTLSTM_CELL_CLONES void StandardCellBackward(const StandardCellGradRow<float>& row, int64_t n) { Backward(row, n); }
ORTLSTM_CELL_CLONES void StandardCellBackward(const StandardCellGradRow<double>& row, int64_t n) { Backward(row, n); }

}  // namespace ortlstm
