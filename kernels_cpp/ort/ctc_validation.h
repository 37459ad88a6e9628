// Runtime checks of the CTC ops' inputs (ops/schema.py CTC_OPS), done once per call before any
// math: shapes, integer types, lengths and labels. Each returns "" and fills CtcDims and the int64
// copies of the integer inputs, or a message naming the input (and sample) with expected vs actual.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ctc/ctc_loss.h"
#include "ort/ort_util.h"

namespace ortlstm::ort {

// The integer inputs as int64 and the view of them the math takes (ctc/ctc_loss.h).
struct CtcIndices {
  std::vector<int64_t> labels;
  std::vector<int64_t> input_lengths;
  std::vector<int64_t> target_lengths;
  ctc::CtcTargets view;  // points into the vectors above
};

// Validates log_probs, targets, input_lengths and target_lengths (CTCLoss's inputs, shared by
// CTCLossGrad) against each other and the attributes.
std::string ValidateCtcInputs(const TensorArg& log_probs, const TensorArg& targets, const TensorArg& input_lengths,
                              const TensorArg& target_lengths, int64_t blank, bool zero_infinity, ctc::CtcDims* dims,
                              CtcIndices* indices);

// CTCLossGrad's other inputs: grad_loss and loss [N], log_alpha [N, T, 2*S+1].
std::string ValidateCtcGradInputs(const ctc::CtcDims& dims, const TensorArg& grad_loss, const TensorArg& loss,
                                  const TensorArg& log_alpha);

}  // namespace ortlstm::ort
