// Activation loops over float arrays, compiled for AVX-512, AVX2 and baseline x86-64 and picked at
// load time (GCC function multi-versioning), so one wheel runs everywhere and uses the widest
// vectors the CPU has. Each element goes through the same operations as the scalar
// FastSigmoid/FastTanh, so results are bit-identical across the versions and the scalar path.
#pragma once

#include <cstdint>

namespace ortlstm {

void SigmoidInPlace(float* x, int64_t n);
void TanhInPlace(float* x, int64_t n);
// out[i] = 1 - tanh(x[i])^2
void TanhDerivatives(const float* x, float* out, int64_t n);

// One batch row of the forward cell for n hidden units in a single pass, for the default
// activations (f = sigmoid, g = h = tanh) without clip, peepholes or input_forget. The same
// operations, in the same order, as the general path in lstm_forward.cc, so both give the same
// bits. No pointer may alias another.
struct StandardCellRow {
  const float* pre;   // [4n] i, o, f, c: X W^T + H R^T, without bias
  const float* bias;  // [4n] Wb + Rb in the same order
  float* gate[4];     // [n] each: activated i, o, f, c
  float* cell;        // [n] C_{t-1}, replaced by C_t
  float* hidden;      // [n] H_t
};
void StandardCellForward(const StandardCellRow& row, int64_t n);

// One batch row of the backward's pointwise pass for the same configuration, in a single pass:
// from dL/dH_t (grad_h plus grad_hall, which may be null) and dL/dC_t (grad_c), the
// pre-activation gradients of step t; grad_c becomes dL/dC_{t-1} and grad_h is zeroed for the
// recurrent GEMM to fill. Same operations and order as the general path in lstm_backward.cc.
// No pointer may alias another.
struct StandardCellGradRow {
  const float* gate[4];    // [n] each: activated i, o, f, c of step t (IOFC)
  const float* cell;       // [n] C_t
  const float* cell_prev;  // [n] C_{t-1}
  const float* grad_hall;  // [n] dL/dHAll_t, or null
  float* grad_h;           // [n] dL/dH_t from later steps, then zeroed
  float* grad_c;           // [n] dL/dC_t, replaced by dL/dC_{t-1}
  float* grad_pre[4];      // [n] each: dL/d(pre-activation) of i, o, f, c
};
void StandardCellBackward(const StandardCellGradRow& row, int64_t n);

}  // namespace ortlstm
