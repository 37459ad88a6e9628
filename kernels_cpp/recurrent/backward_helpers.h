// What the backward time loops of the GRU (gru/gru_backward.cc) and the RNN (rnn/rnn_backward.cc)
// share, so that a cell's backward file holds only its own gradient math: the states each step
// started from, dL/dH at the last step and dH0, and running the directions (two parallel tasks
// when the executor has the width, each cut into groups of batch entries). The LSTM's backward
// (lstm/lstm_backward.cc) keeps its own, as it also cuts a step into blocks of hidden units.
// Layouts: lstm/lstm_dims.h.
#pragma once

#include <algorithm>

#include "common/cpu_info.h"
#include "common/parallel.h"
#include "common/scratch.h"
#include "lstm/lstm_dims.h"
#include "lstm/lstm_math.h"

namespace ortlstm {

// hidden_prev [T*N, H], X row order: the state step t of direction d started from (initial_h, or
// zeros without it, then HAll of the entry's previous active step).
template <typename T>
void GatherHiddenPrev(const LstmDims& dims, int64_t d, bool reverse, const T* initial_h, const T* HAll,
                      const int32_t* sequence_lens, T* hidden_prev) {
  const int64_t H = dims.hidden_size;
  for (int64_t b = 0; b < dims.batch_size; ++b) {
    const T* state = initial_h ? initial_h + dims.StateRow(d, b) * H : nullptr;
    for (int64_t s = 0; s < dims.seq_length; ++s) {
      const int64_t t = reverse ? dims.seq_length - 1 - s : s;
      T* out = hidden_prev + dims.XRow(t, b) * H;
      if (state) {
        std::copy_n(state, H, out);
      } else {
        std::fill_n(out, H, T(0));
      }
      if (sequence_lens == nullptr || t < sequence_lens[b]) state = HAll + dims.SeqRow(t, d, b) * H;
    }
  }
}

// dh [N, H] <- dL/dH of direction d's last step: grad_Ht, or zeros without it or for an entry that
// ran no step (its Ht is zero, not a function of initial_h).
template <typename T>
void LastStepGradient(const LstmDims& dims, int64_t d, const T* grad_Ht, const int32_t* sequence_lens, T* dh) {
  const int64_t H = dims.hidden_size;
  for (int64_t b = 0; b < dims.batch_size; ++b) {
    const bool ran = dims.seq_length > 0 && (sequence_lens == nullptr || sequence_lens[b] > 0);
    if (grad_Ht && ran) {
      std::copy_n(grad_Ht + dims.StateRow(d, b) * H, H, dh + b * H);
    } else {
      std::fill_n(dh + b * H, H, T(0));
    }
  }
}

// dH0 rows of direction d <- dh [N, H], when dH0 is requested.
template <typename T>
void WriteInitialStateGradient(const LstmDims& dims, int64_t d, const T* dh, T* dH0) {
  if (!dH0) return;
  const int64_t H = dims.hidden_size;
  for (int64_t b = 0; b < dims.batch_size; ++b) std::copy_n(dh + b * H, H, dH0 + dims.StateRow(d, b) * H);
}

// One direction's backward time loop in `groups` tasks of batch entries (entries are independent
// through the recurrence): each task takes its entries from the last step to the first, calling
// step(t, group, dh, dh_prev, k), which reads dL/dH_t from dh [N, H] and writes dL/dH_{t-1} to
// dh_prev; the two swap roles every step. Afterwards `dh` holds dL/dH of the first step's input.
template <typename T, typename StepFn>
void RunBackwardSteps(const LstmDims& dims, bool reverse, int64_t groups, const Executor& executor, Scratch<T>* dh,
                      Scratch<T>* dh_prev, const StepFn& step) {
  executor.For(static_cast<size_t>(groups), [&](size_t k) {
    const Range group = SplitRange(dims.batch_size, groups, static_cast<int64_t>(k));
    T* now = dh->get();
    T* before = dh_prev->get();
    for (int64_t s = dims.seq_length - 1; s >= 0; --s) {
      step(reverse ? dims.seq_length - 1 - s : s, group, now, before, k);
      std::swap(now, before);
    }
  });
  if (dims.seq_length % 2 == 1) std::swap(*dh, *dh_prev);
}

// Runs a cell's backward over its directions. make_direction(d, groups) returns the direction's
// object (by value), whose Recurrence(executor) runs the time loop in `groups` tasks of batch
// entries and WeightGradients(executor) the GEMMs over all steps. The recurrences of two
// directions are independent: one task each, serial inside; dX sums the directions' shares
// afterwards, in direction order.
template <typename T, typename MakeDirection>
void RunBackward(const LstmDims& dims, const Executor& executor, const MakeDirection& make_direction) {
  const bool directions_in_parallel = dims.num_directions == 2 && executor.Width() >= 2;
  const SerialExecutor serial;
  const Executor& step_executor = directions_in_parallel ? static_cast<const Executor&>(serial) : executor;
  // Groups of entries only (the step's GEMMs are not cut into blocks of units here).
  const int64_t groups = SplitTimeLoop<T>(dims, step_executor, L2CacheBytes()).row_groups;
  if (directions_in_parallel) {
    auto forward = make_direction(0, groups);
    auto backward = make_direction(1, groups);
    executor.For(2, [&](size_t d) { (d == 0 ? forward : backward).Recurrence(serial); });
    forward.WeightGradients(executor);
    backward.WeightGradients(executor);
    return;
  }
  for (int64_t d = 0; d < dims.num_directions; ++d) {
    auto direction = make_direction(d, groups);
    direction.Recurrence(executor);
    direction.WeightGradients(executor);
  }
}

}  // namespace ortlstm
