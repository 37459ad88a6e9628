// ORT-free math of SigmoidGrad and TanhGrad (ops/schema.py GRADIENT_OPS): an activation's gradient
// from its output, one pass over contiguous arrays, float and double, split into fixed chunks on
// an Executor (common/parallel.h). The adapter (ort/activation_grad_ops.cc) has checked the shapes.
#pragma once

#include <cstdint>

#include "common/parallel.h"

namespace ortlstm::pointwise {

enum class Activation { kSigmoid, kTanh };

// grad_x[i] = grad_y[i] * (y[i] * (1 - y[i]))  (kSigmoid)
// grad_x[i] = grad_y[i] * (1 - y[i] * y[i])    (kTanh)
// Each operation rounded on its own, in that order, as the standard ops Sub and Mul round it.
template <typename T>
void ActivationGrad(Activation activation, int64_t count, const T* grad_y, const T* y, T* grad_x,
                    const Executor& executor);

}  // namespace ortlstm::pointwise
