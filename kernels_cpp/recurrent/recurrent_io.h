// The tensors both recurrent drivers read (forward_driver.h's ForwardIo, backward_driver.h's
// BackwardIo derive from it), taken once from a cell's forward or backward tensors, which name them
// alike (LstmForwardTensors, GruBackwardTensors, ...).
#pragma once

#include <cstdint>

#include "common/bf16_gemm.h"

namespace ortlstm {

template <typename T>
struct RecurrentInputs {
  const T* X = nullptr;
  const T* W = nullptr;  // [D, G*H, I]
  const T* R = nullptr;  // [D, G*H, H]
  const int32_t* sequence_lens = nullptr;
  const T* initial_h = nullptr;
  MatmulPrecision precision = MatmulPrecision::kFloat32;  // of every GEMM (the op's matmul_precision)

  // `precision` is the op's matmul_precision (required, so that no cell forgets to pass it on).
  template <typename Tensors>
  void TakeInputs(const Tensors& tensors, MatmulPrecision matmul_precision) {
    X = tensors.X;
    W = tensors.W;
    R = tensors.R;
    sequence_lens = tensors.sequence_lens;
    initial_h = tensors.initial_h;
    precision = matmul_precision;
  }
};

}  // namespace ortlstm
