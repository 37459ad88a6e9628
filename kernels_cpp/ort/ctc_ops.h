// ORT custom-op definitions of the CTC ops (ops/schema.py CTC_OPS) for float and double: CTCLoss
// and CTCLossGrad read and validate their inputs (ort/ctc_validation.h), allocate their outputs
// and call ctc/ctc_loss.h.
#pragma once

#include <string>

#include "ort/ort_util.h"

namespace ortlstm::ort {

// Appends the op definitions (CTCLoss and CTCLossGrad x two element types) to `domain`.
std::string AddCtcOps(OrtCustomOpDomain* domain);

}  // namespace ortlstm::ort
