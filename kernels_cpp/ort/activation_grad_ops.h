// ORT custom-op definitions of SigmoidGrad and TanhGrad (ops/schema.py GRADIENT_OPS) for float and
// double: check that dY has Y's shape, allocate dX and call pointwise/activation_grad.h.
#pragma once

#include <string>

#include "ort/ort_util.h"

namespace ortlstm::ort {

// Appends the op definitions (SigmoidGrad and TanhGrad x two element types) to `domain`.
std::string AddActivationGradOps(OrtCustomOpDomain* domain);

}  // namespace ortlstm::ort
