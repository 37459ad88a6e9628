// Pointwise pieces shared by the forward and the backward: clipping, activations over arrays and
// the derivative of a gate activation from its output. The loops are written so GCC vectorizes
// them (one activation kind per loop, no calls); the scalar Apply() and the array loops run the
// same operations, so a clipped pre-activation yields bit-identical gate values in both places,
// which is how the backward recognises it.
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>

#include "lstm/activation.h"
#include "lstm/lstm_config.h"
#include "lstm/standard_cell.h"
#include "lstm/vector_loops.h"

namespace ortlstm {

// Whether direction d runs the fused cell loops (StandardCellForward/Backward in
// standard_cell.h): f = sigmoid, g = h = tanh, no clip, no peepholes, input_forget off.
inline bool UsesStandardCell(const LstmConfig& config, int64_t d, bool peepholes) {
  const DirectionActivations& acts = config.activations[d];
  return acts.f.kind == ActivationKind::kSigmoid && acts.g.kind == ActivationKind::kTanh &&
         acts.h.kind == ActivationKind::kTanh && !config.clip.has_value() && !peepholes && !config.input_forget;
}

// x <- act(x) for x[0, n).
template <typename T>
inline void ApplyInPlace(const Activation& act, T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (act.kind == ActivationKind::kSigmoid) return SigmoidInPlace(x, n);
    if (act.kind == ActivationKind::kTanh) return TanhInPlace(x, n);
  }
  switch (act.kind) {
    case ActivationKind::kSigmoid:
      for (int64_t i = 0; i < n; ++i) x[i] = FastSigmoid(x[i]);
      return;
    case ActivationKind::kTanh:
      for (int64_t i = 0; i < n; ++i) x[i] = FastTanh(x[i]);
      return;
    default:
      for (int64_t i = 0; i < n; ++i) x[i] = Apply<T>(act, x[i]);
      return;
  }
}

// out <- d act / d x at x, for x[0, n).
template <typename T>
inline void DerivativeFromInputs(const Activation& act, const T* x, T* out, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (act.kind == ActivationKind::kTanh) return TanhDerivatives(x, out, n);
  }
  if (act.kind == ActivationKind::kTanh) {
    for (int64_t i = 0; i < n; ++i) {
      const T y = FastTanh(x[i]);
      out[i] = T(1) - y * y;
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = DerivativeFromInput<T>(act, x[i]);
}

// x <- clip(x) to [-threshold, threshold]; NaN stays NaN.
template <typename T>
inline void ClipInPlace(T* x, int64_t n, T threshold) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] > threshold ? threshold : (x[i] < -threshold ? -threshold : x[i]);
}

template <typename T>
struct GateActivation {
  Activation act;
  bool clipped = false;
  T at_upper = T(0);  // act(+clip)
  T at_lower = T(0);  // act(-clip)

  GateActivation(const Activation& a, const std::optional<float>& clip) : act(a), clipped(clip.has_value()) {
    if (clipped) {
      at_upper = Apply<T>(act, static_cast<T>(*clip));
      at_lower = Apply<T>(act, -static_cast<T>(*clip));
    }
  }

  // out <- d act(clip(x)) / dx given y = act(clip(x)), for y[0, n): zero where the clip was
  // active (y equals act(+-clip) exactly; a flat stretch of act has zero derivative anyway).
  void DerivativesFromOutputs(const T* y, T* out, int64_t n) const {
    switch (act.kind) {
      case ActivationKind::kSigmoid:
        SigmoidDerivativesFromOutputs(y, out, n);
        break;
      case ActivationKind::kTanh:
        TanhDerivativesFromOutputs(y, out, n);
        break;
      default:
        for (int64_t i = 0; i < n; ++i) out[i] = DerivativeFromOutput<T>(act, y[i]);
        break;
    }
    if (clipped) {
      for (int64_t i = 0; i < n; ++i) out[i] = (y[i] == at_upper || y[i] == at_lower) ? T(0) : out[i];
    }
  }
};

}  // namespace ortlstm
