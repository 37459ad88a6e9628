// Pointwise pieces shared by the forward and the backward: clipping and the derivative of a gate
// activation from its output. Both directions of the flow call the same Apply() so that a clipped
// pre-activation produces bit-identical outputs, which is how the backward recognises it.
#pragma once

#include <algorithm>
#include <optional>

#include "lstm/activation.h"
#include "lstm/lstm_config.h"

namespace ortlstm {

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

  // d act(clip(x)) / dx given y = act(clip(x)): zero where the clip was active.
  T DerivativeFromOutput(T y) const {
    if (clipped && (y == at_upper || y == at_lower)) return T(0);
    return ortlstm::DerivativeFromOutput<T>(act, y);
  }
};

// Clip to [-threshold, threshold]; NaN stays NaN.
template <typename T>
inline T ClipTo(T x, T threshold) {
  return x > threshold ? threshold : (x < -threshold ? -threshold : x);
}

}  // namespace ortlstm
