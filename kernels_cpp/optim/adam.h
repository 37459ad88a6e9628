// torch.optim.Adam / AdamW's update of one parameter (torch's single-tensor CPU path), elementwise.
// The formulas and which products are fused: docs/ops.md#adamupdate; the graph that feeds the
// scalars: graphs/optimizers.py.
#pragma once

#include <cstdint>

#include "common/parallel.h"

namespace ortlstm {

// torch's hyperparameters and the update's lr and step, as Python floats (float64).
struct AdamHyperparameters {
  double lr = 0.0;
  double step = 1.0;
  double beta1 = 0.0;
  double beta2 = 0.0;
  double eps = 0.0;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // AdamW
  bool maximize = false;
};

// The update's scalars, each rounded to T once, where torch hands the Python float to a tensor op.
template <typename T>
struct AdamScalars {
  T neg_step_size;          // -lr / (1 - beta1**step)
  T bias_correction2_sqrt;  // sqrt(1 - beta2**step)
  T exp_avg_weight;         // 1 - beta1, the lerp weight
  T beta2;
  T exp_avg_sq_weight;  // 1 - beta2
  T eps;
  bool has_weight_decay = false;  // Adam's L2 term: grad += weight_decay * param
  T weight_decay{};
  bool has_decay = false;  // AdamW: param *= decay before the step
  T decay{};
  bool maximize = false;
};

// `count` elements each; max_exp_avg_sq and max_exp_avg_sq_out both null (no amsgrad) or both set.
// Outputs may not alias inputs.
template <typename T>
struct AdamTensors {
  int64_t count = 0;
  const T* param = nullptr;
  const T* grad = nullptr;
  const T* exp_avg = nullptr;
  const T* exp_avg_sq = nullptr;
  const T* max_exp_avg_sq = nullptr;
  T* param_out = nullptr;
  T* exp_avg_out = nullptr;
  T* exp_avg_sq_out = nullptr;
  T* max_exp_avg_sq_out = nullptr;
};

// The scalars torch's _single_tensor_adam computes from `h` in Python floats, rounded to T.
template <typename T>
AdamScalars<T> AdamScalarsFor(const AdamHyperparameters& h);

// Runs the update over the executor's tasks (contiguous ranges of elements; every element is
// computed the same way whichever task has it, so the result does not depend on the split).
template <typename T>
void AdamUpdate(const AdamScalars<T>& scalars, const AdamTensors<T>& tensors, const Executor& executor);

}  // namespace ortlstm
