// torch.optim.Adam / AdamW's update of one parameter (torch's single-tensor CPU path), elementwise.
// The formulas and which products are fused: docs/ops.md#adamupdate; the graph that feeds the
// scalars: graphs/optimizers.py.
#pragma once

#include <cstdint>

#include "common/parallel.h"

namespace ortlstm {

// The update's scalars, each already rounded to T as torch rounds its Python floats.
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

// Runs the update over the executor's tasks (contiguous ranges of elements; every element is
// computed the same way whichever task has it, so the result does not depend on the split).
template <typename T>
void AdamUpdate(const AdamScalars<T>& scalars, const AdamTensors<T>& tensors, const Executor& executor);

}  // namespace ortlstm
