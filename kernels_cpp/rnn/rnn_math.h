// Entry points of the ORT-free vanilla RNN math: forward (RNNTraining) and backward (RNNGrad). The
// RNN is the recurrent family's third cell: it shares the LSTM's attribute parsing
// (ParseRecurrentConfig with one activation per direction, in DirectionActivations' f), dims and
// layouts (LstmDims with gates = 1; the diagram in lstm/lstm_dims.h holds with hidden_size in place
// of 4*hidden_size and no stash), activations and clipping (lstm/gate_math.h), and the BLAS and
// executor (common/). The cell's pointwise math is rnn/rnn_cell.h; the time loops are
// rnn_forward.cc and rnn_backward.cc. Inputs are validated by the adapter (ort/lstm_validation.cc).
#pragma once

#include <cstdint>

#include "common/parallel.h"
#include "common/scratch.h"
#include "lstm/lstm_config.h"
#include "lstm/lstm_dims.h"

namespace ortlstm {

// Optional tensors are nullptr when absent (inputs) or not requested (outputs).
template <typename T>
struct RnnForwardTensors {
  const T* X = nullptr;
  const T* W = nullptr;
  const T* R = nullptr;
  const T* B = nullptr;
  const int32_t* sequence_lens = nullptr;
  const T* initial_h = nullptr;
  T* HAll = nullptr;
  T* Ht = nullptr;
};

template <typename T>
struct RnnBackwardTensors {
  const T* X = nullptr;
  const T* W = nullptr;
  const T* R = nullptr;
  const T* B = nullptr;
  const int32_t* sequence_lens = nullptr;
  const T* initial_h = nullptr;
  const T* HAll = nullptr;
  const T* grad_HAll = nullptr;
  const T* grad_Ht = nullptr;
  T* dX = nullptr;
  T* dW = nullptr;
  T* dR = nullptr;
  T* dB = nullptr;
  T* dH0 = nullptr;
};

// Work is split into tasks of `executor` (the whole-sequence GEMMs); the BLAS must be
// single-threaded (common/blas.h). Scratch comes from `allocator`; std::bad_alloc propagates.
// `config` is an LstmConfig parsed with one activation per direction (f).
template <typename T>
void RnnForward(const LstmDims& dims, const LstmConfig& config, const RnnForwardTensors<T>& tensors,
                const Executor& executor, const ScratchAllocator& allocator);

template <typename T>
void RnnBackward(const LstmDims& dims, const LstmConfig& config, const RnnBackwardTensors<T>& tensors,
                 const Executor& executor, const ScratchAllocator& allocator);

}  // namespace ortlstm
