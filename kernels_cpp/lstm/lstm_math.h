// Entry points of the ORT-free LSTM math: forward (LSTMTraining) and backward (LSTMGrad).
// Inputs are validated by the adapter (ort/); shapes and layouts are in lstm/lstm_dims.h.
#pragma once

#include <cstdint>

#include "common/parallel.h"
#include "common/scratch.h"
#include "lstm/lstm_config.h"
#include "lstm/lstm_dims.h"

namespace ortlstm {

// Optional tensors are nullptr when absent (inputs) or not requested (outputs).
template <typename T>
struct LstmForwardTensors {
  const T* X = nullptr;
  const T* W = nullptr;
  const T* R = nullptr;
  const T* B = nullptr;
  const int32_t* sequence_lens = nullptr;
  const T* initial_h = nullptr;
  const T* initial_c = nullptr;
  const T* P = nullptr;
  T* HAll = nullptr;
  T* Ht = nullptr;
  T* Ct = nullptr;
  T* CAll = nullptr;
  T* IOFC = nullptr;
};

template <typename T>
struct LstmBackwardTensors {
  const T* X = nullptr;
  const T* W = nullptr;
  const T* R = nullptr;
  const int32_t* sequence_lens = nullptr;
  const T* initial_h = nullptr;
  const T* initial_c = nullptr;
  const T* HAll = nullptr;
  const T* CAll = nullptr;
  const T* IOFC = nullptr;
  const T* grad_HAll = nullptr;
  const T* grad_Ht = nullptr;
  const T* grad_Ct = nullptr;
  const T* P = nullptr;
  T* dX = nullptr;
  T* dW = nullptr;
  T* dR = nullptr;
  T* dB = nullptr;
  T* dH0 = nullptr;
  T* dC0 = nullptr;
  T* dP = nullptr;
};

// How many blocks of hidden units one time step is cut into (forward and backward alike): as
// many as the executor is wide, while each block keeps enough recurrent-GEMM work to pay for a task.
inline int64_t StepBlocks(const LstmDims& dims, const Executor& executor) {
  constexpr int64_t kMinBlockWork = int64_t{1} << 17;  // multiply-adds of one step's recurrent GEMM
  const int64_t work = dims.batch_size * dims.GateWidth() * dims.hidden_size;
  int64_t blocks = work / kMinBlockWork;
  if (blocks > executor.Width()) blocks = executor.Width();
  if (blocks > dims.hidden_size) blocks = dims.hidden_size;
  return blocks < 1 ? 1 : blocks;
}

// Work is split into tasks of `executor`; the BLAS must be single-threaded (common/blas.h).
// Scratch memory comes from `allocator`; std::bad_alloc propagates when it runs out.
template <typename T>
void LstmForward(const LstmDims& dims, const LstmConfig& config, const LstmForwardTensors<T>& tensors,
                 const Executor& executor, const ScratchAllocator& allocator);

template <typename T>
void LstmBackward(const LstmDims& dims, const LstmConfig& config, const LstmBackwardTensors<T>& tensors,
                  const Executor& executor, const ScratchAllocator& allocator);

}  // namespace ortlstm
