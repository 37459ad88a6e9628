// ORT custom-op definitions of RNNTraining and RNNGrad for float and double. Like the LSTM ops
// (ort/lstm_ops.h): read inputs, validate them (ort/lstm_validation.h), allocate outputs and call
// the math in rnn/.
#pragma once

#include "ort/ort_util.h"

namespace ortlstm::ort {

// Appends the four op definitions (two ops x two element types) to `domain`.
std::string AddRnnOps(OrtCustomOpDomain* domain);

}  // namespace ortlstm::ort
