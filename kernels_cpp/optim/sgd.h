// torch.optim.SGD's update of one parameter (torch's single-tensor CPU path), elementwise.
// The formulas and which products are fused: docs/ops.md#sgdupdate; the graph that feeds the
// scalars: graphs/optimizers.py.
#pragma once

#include <cstdint>

#include "common/parallel.h"

namespace ortlstm {

// torch's hyperparameters and the update's lr and step, as Python floats (float64).
struct SgdHyperparameters {
  double lr = 0.0;
  double step = 1.0;
  double momentum = 0.0;  // > 0 exactly when there is a momentum buffer
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
};

// The update's scalars, each rounded to T once, where torch hands the Python float to a tensor op.
template <typename T>
struct SgdScalars {
  T neg_lr;  // param.add_(grad, alpha=-lr)
  bool has_weight_decay = false;
  T weight_decay{};
  T momentum{};
  T one_minus_dampening{};  // buf.mul_(momentum).add_(grad, alpha=1 - dampening)
  bool first_step = false;  // the buffer starts as the gradient
  bool nesterov = false;
  bool maximize = false;
};

// `count` elements each; momentum_buffer and momentum_buffer_out both null (no momentum) or both
// set. Outputs may not alias inputs.
template <typename T>
struct SgdTensors {
  int64_t count = 0;
  const T* param = nullptr;
  const T* grad = nullptr;
  const T* momentum_buffer = nullptr;
  T* param_out = nullptr;
  T* momentum_buffer_out = nullptr;
};

// The scalars torch's _single_tensor_sgd computes from `h` in Python floats, rounded to T.
template <typename T>
SgdScalars<T> SgdScalarsFor(const SgdHyperparameters& h);

// Runs the update over the executor's tasks (contiguous ranges of elements; every element is
// computed the same way whichever task has it, so the result does not depend on the split).
template <typename T>
void SgdUpdate(const SgdScalars<T>& scalars, const SgdTensors<T>& tensors, const Executor& executor);

}  // namespace ortlstm
