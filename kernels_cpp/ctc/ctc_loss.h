// ORT-free math of the CTC loss (ops/schema.py CTC_OPS, torch's _ctc_loss and _ctc_loss_backward):
// the forward (log_alpha and the per-sample loss) and the gradient with respect to log_probs, in
// log space, float and double, one task per sample on an Executor (common/parallel.h). The adapter
// (ort/ctc_ops.cc) has validated every shape, length and label; this layer only asserts.
//
// Memory layout (all row-major, contiguous):
//   log_probs, grad_log_probs  [max_time, batch_size, num_classes]   time-major, as torch's
//   log_alpha                  [batch_size, max_time, num_states]     num_states = 2*max_target_length+1
//   labels                     sample n's target is labels[label_offsets[n] + i], i < target_lengths[n]
//   extended target l'         state s is blank for even s, labels[s/2] for odd s
#pragma once

#include <cstdint>
#include <vector>

#include "common/parallel.h"

namespace ortlstm::ctc {

// Sizes and attributes, computed once by the adapter.
struct CtcDims {
  int64_t max_time = 0;           // T, log_probs' first axis
  int64_t batch_size = 0;         // N
  int64_t num_classes = 0;        // C, blank included
  int64_t max_target_length = 0;  // S: padded targets' second axis, or max(target_lengths)
  int64_t blank = 0;
  bool zero_infinity = false;

  int64_t NumStates() const { return 2 * max_target_length + 1; }
};

// The integer inputs, converted to int64 by the adapter.
struct CtcTargets {
  const int64_t* labels = nullptr;          // see the layout above
  std::vector<int64_t> label_offsets;       // [batch_size]
  const int64_t* input_lengths = nullptr;   // [batch_size], each in [0, max_time]
  const int64_t* target_lengths = nullptr;  // [batch_size], each in [0, max_target_length]
};

// Fills log_alpha (-inf where the recursion does not reach) and loss (the negative log-likelihood;
// 0 instead of +inf with zero_infinity).
template <typename T>
void CtcForward(const CtcDims& dims, const CtcTargets& targets, const T* log_probs, T* log_alpha, T* loss,
                const Executor& executor);

// grad_log_probs from the forward's loss and log_alpha, torch's convention (docs/ops.md#ctclossgrad).
template <typename T>
void CtcBackward(const CtcDims& dims, const CtcTargets& targets, const T* grad_loss, const T* log_probs, const T* loss,
                 const T* log_alpha, T* grad_log_probs, const Executor& executor);

}  // namespace ortlstm::ctc
