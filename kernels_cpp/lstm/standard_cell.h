// The fused pointwise work of the default cell (f = sigmoid, g = h = tanh, no clip, peepholes
// or input_forget) for float and double, forward and backward: one call per batch row, compiled
// for AVX-512, AVX2 + FMA and baseline x86-64 and picked at load time (GCC function
// multi-versioning).
//
// Unlike the rest of the kernels, standard_cell.cc is compiled with floating-point contraction
// (-ffp-contract=fast, CMakeLists.txt): where the CPU has FMA, a * b + c is one fused operation.
// That cuts the forward cell's time by a third (16 rows x 256 units, in cache: 14.6 -> 10 us).
// The gates differ from the unfused formulas' by at most 2 ulp (sigmoid) or 1.2e-7 (tanh), no
// less accurate against float64 (max error 1.3e-7 relative, 9e-8 absolute), and nothing needs
// them bit-identical to a scalar call: the backward's recognition of clipped gates, which does,
// never runs on these configs (lstm/gate_math.h). In double the activations are within 2 ulp of
// the exact values (lstm/fast_math.h).
#pragma once

#include <cstdint>

namespace ortlstm {

// One batch row of the forward cell for n hidden units: the four gates, then the state update.
// The gates are activated in place in `pre`, or written to `gate` when that is set. No pointer
// may alias another.
template <typename T>
struct StandardCellRow {
  T* pre;         // [4n] i, o, f, c: X W^T + H R^T, without bias; activated in place unless
                  // `gate` is set
  const T* bias;  // [4n] Wb + Rb in the same order
  T* gate[4];     // [n] each: activated i, o, f, c, or all null
  T* cell;        // [n] C_{t-1}, replaced by C_t
  T* hidden;      // [n] H_t
};
void StandardCellForward(const StandardCellRow<float>& row, int64_t n);
void StandardCellForward(const StandardCellRow<double>& row, int64_t n);

// One batch row of the backward's pointwise pass for the same configuration, in a single pass:
// from dL/dH_t (grad_h plus grad_hall, which may be null) and dL/dC_t (grad_c), the
// pre-activation gradients of step t; grad_c becomes dL/dC_{t-1} and grad_h is zeroed for the
// recurrent GEMM to fill. The formulas of the general path in lstm_backward.cc. No pointer may
// alias another.
template <typename T>
struct StandardCellGradRow {
  const T* gate[4];    // [n] each: activated i, o, f, c of step t (IOFC)
  const T* cell;       // [n] C_t
  const T* cell_prev;  // [n] C_{t-1}
  const T* grad_hall;  // [n] dL/dHAll_t, or null
  T* grad_h;           // [n] dL/dH_t from later steps, then zeroed
  T* grad_c;           // [n] dL/dC_t, replaced by dL/dC_{t-1}
  T* grad_pre[4];      // [n] each: dL/d(pre-activation) of i, o, f, c
};
void StandardCellBackward(const StandardCellGradRow<float>& row, int64_t n);
void StandardCellBackward(const StandardCellGradRow<double>& row, int64_t n);

}  // namespace ortlstm
