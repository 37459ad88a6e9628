// The vanilla RNN cell's pointwise math, apart from its time loop (rnn_forward.cc, rnn_backward.cc),
// so that the cell can become a policy of a shared recurrent driver: everything here works on one
// row block (the `n` values of one batch entry's step), the loops own the GEMMs and the order.
//
//   forward:   H_t = f(clip(a)),  a = X_t W^T + H_{t-1} R^T + Wb + Rb  (a arrives with the GEMMs done)
//   backward:  da = (dL/dH_t) . f'(a), f' read off H_t (zero where clip held a)
#pragma once

#include <cstdint>
#include <optional>

#include "lstm/gate_math.h"

namespace ortlstm {

template <typename T>
struct RnnCell {
  Activation f;
  std::optional<float> clip;
  GateActivation<T> derivative;  // f' from f's output, clip-aware

  RnnCell(const Activation& act, const std::optional<float>& threshold)
      : f(act), clip(threshold), derivative(act, threshold) {}

  // a[0, n) <- f(clip(a)): the pre-activations of one row block become its new state.
  void Forward(T* a, int64_t n) const {
    if (clip) ClipInPlace(a, n, static_cast<T>(*clip));
    if (f.kind == ActivationKind::kRelu) {
      // torch's nn.RNN(nonlinearity="relu"): one loop the compiler vectorizes; NaN stays NaN (Apply's rule).
      for (int64_t j = 0; j < n; ++j) a[j] = a[j] > T(0) || a[j] != a[j] ? a[j] : T(0);
      return;
    }
    ApplyInPlace(f, a, n);
  }

  // da[0, n) <- (dh + grad_hall) . f'(a), given the row block's output h = f(clip(a)); grad_hall may
  // be nullptr (no gradient reaches HAll). `prime` is scratch of n values.
  void Backward(const T* h, const T* dh, const T* grad_hall, T* prime, T* da, int64_t n) const {
    if (f.kind == ActivationKind::kRelu && !clip) {
      for (int64_t j = 0; j < n; ++j) prime[j] = h[j] > T(0) ? T(1) : T(0);  // DerivativeFromOutput's Relu
    } else {
      derivative.DerivativesFromOutputs(h, prime, n);
    }
    if (grad_hall) {
      for (int64_t j = 0; j < n; ++j) da[j] = (dh[j] + grad_hall[j]) * prime[j];
    } else {
      for (int64_t j = 0; j < n; ++j) da[j] = dh[j] * prime[j];
    }
  }
};

}  // namespace ortlstm
