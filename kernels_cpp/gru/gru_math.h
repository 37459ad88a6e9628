// Entry points of the ORT-free GRU math: forward (GRUTraining) and backward (GRUGrad). The GRU is
// the recurrent family's second cell: it shares the LSTM's attribute parsing (ParseRecurrentConfig
// with two activations per direction), dims and layouts (LstmDims with gates = 3; the diagram in
// lstm/lstm_dims.h holds with 3*hidden_size and ZRH in place of 4*hidden_size and IOFC),
// activations and clipping (lstm/gate_math.h), and the BLAS and executor (common/). Inputs are
// validated by the adapter (ort/lstm_validation.cc).
#pragma once

#include <cstdint>

#include "common/parallel.h"
#include "common/scratch.h"
#include "lstm/lstm_config.h"
#include "lstm/lstm_dims.h"

namespace ortlstm {

// ONNX GRU's attributes: the recurrent ones (activations f, g in DirectionActivations' f and g;
// h unused) and linear_before_reset.
struct GruConfig {
  LstmConfig cell;
  bool linear_before_reset = false;
};

inline MatmulPrecision MatmulPrecisionOf(const GruConfig& config) { return config.cell.matmul_precision; }

// Optional tensors are nullptr when absent (inputs) or not requested (outputs).
template <typename T>
struct GruForwardTensors {
  const T* X = nullptr;
  const T* W = nullptr;
  const T* R = nullptr;
  const T* B = nullptr;
  const int32_t* sequence_lens = nullptr;
  const T* initial_h = nullptr;
  T* HAll = nullptr;
  T* Ht = nullptr;
  T* ZRH = nullptr;
};

template <typename T>
struct GruBackwardTensors {
  const T* X = nullptr;
  const T* W = nullptr;
  const T* R = nullptr;
  const T* B = nullptr;
  const int32_t* sequence_lens = nullptr;
  const T* initial_h = nullptr;
  const T* HAll = nullptr;
  const T* ZRH = nullptr;
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
template <typename T>
void GruForward(const LstmDims& dims, const GruConfig& config, const GruForwardTensors<T>& tensors,
                const Executor& executor, const ScratchAllocator& allocator);

template <typename T>
void GruBackward(const LstmDims& dims, const GruConfig& config, const GruBackwardTensors<T>& tensors,
                 const Executor& executor, const ScratchAllocator& allocator);

}  // namespace ortlstm
