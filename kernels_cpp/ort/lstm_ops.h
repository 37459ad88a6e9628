// ORT custom-op definitions of LSTMTraining and LSTMGrad for float and double. ORT merges the two
// element types of each op into one schema and dispatches on X's type. The kernels read inputs,
// validate them (ort/lstm_validation.h), allocate outputs and call the math in lstm/.
#pragma once

#include "ort/ort_util.h"

namespace ortlstm::ort {

// Appends the four op definitions (two ops x two element types) to `domain`.
std::string AddLstmOps(OrtCustomOpDomain* domain);

}  // namespace ortlstm::ort
