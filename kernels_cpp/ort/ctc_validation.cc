// Shape, type and value checks of the CTC ops. Dims come from log_probs ([T, N, C]) and targets
// (S); every other input is compared with what they imply. Labels and lengths are read once here
// and converted to int64, so the math never sees an int32 or an unchecked value.
#include "ort/ctc_validation.h"

#include <sstream>

#include "common/checked_math.h"
#include "generated/op_schema.h"

namespace ortlstm::ort {
namespace {

namespace limits = schema::limits;

// Copies an int32 or int64 tensor into *values; a message naming `name` for any other type.
std::string ReadIntegers(const TensorArg& arg, const char* name, std::vector<int64_t>* values) {
  const std::optional<int64_t> count = CheckedProduct(arg.shape);
  if (!count) return std::string(name) + ": shape " + FormatShape(arg.shape) + " overflows";
  values->resize(static_cast<size_t>(*count));
  if (arg.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
    const int64_t* data = arg.Data<int64_t>();
    values->assign(data, data + *count);
  } else if (arg.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32) {
    const int32_t* data = arg.Data<int32_t>();
    values->assign(data, data + *count);
  } else {
    return std::string(name) + ": expected element type int32 or int64, got ONNX element type " +
           std::to_string(static_cast<int>(arg.type));
  }
  return "";
}

// "" if every lengths[n] lies in [0, max]; else a message naming the entry.
std::string CheckLengths(const std::vector<int64_t>& lengths, const char* name, int64_t max,
                         const std::string& max_text) {
  for (size_t n = 0; n < lengths.size(); ++n) {
    if (lengths[n] < 0 || lengths[n] > max) {
      std::ostringstream msg;
      msg << name << "[" << n << "]: expected a value in [0, " << max_text << "], got " << lengths[n];
      return msg.str();
    }
  }
  return "";
}

std::string ExpectShape(const TensorArg& arg, const char* name, const std::vector<int64_t>& expected,
                        const std::string& expected_text) {
  if (arg.shape == expected) return "";
  return std::string(name) + ": expected shape " + expected_text + ", got " + FormatShape(arg.shape);
}

}  // namespace

std::string ValidateCtcInputs(const TensorArg& log_probs, const TensorArg& targets, const TensorArg& input_lengths,
                              const TensorArg& target_lengths, int64_t blank, bool zero_infinity, ctc::CtcDims* dims,
                              CtcIndices* indices) {
  if (log_probs.shape.size() != 3) {
    return "log_probs: expected rank 3 [T, N, C] (time-major), got shape " + FormatShape(log_probs.shape);
  }
  dims->max_time = log_probs.shape[0];
  dims->batch_size = log_probs.shape[1];
  dims->num_classes = log_probs.shape[2];
  dims->blank = blank;
  dims->zero_infinity = zero_infinity;
  const int64_t batch = dims->batch_size;
  const std::string batch_text = "[N=" + std::to_string(batch) + "]";
  if (blank >= dims->num_classes) {
    return "attribute blank: expected a value in [0, C=" + std::to_string(dims->num_classes) +
           ") (log_probs' dim 2), got " + std::to_string(blank);
  }
  std::string error = ExpectShape(input_lengths, "input_lengths", {batch}, batch_text);
  if (error.empty()) error = ExpectShape(target_lengths, "target_lengths", {batch}, batch_text);
  if (error.empty()) error = ReadIntegers(input_lengths, "input_lengths", &indices->input_lengths);
  if (error.empty()) error = ReadIntegers(target_lengths, "target_lengths", &indices->target_lengths);
  if (error.empty()) error = ReadIntegers(targets, "targets", &indices->labels);
  if (!error.empty()) return error;
  error = CheckLengths(indices->input_lengths, "input_lengths", dims->max_time,
                       "T=" + std::to_string(dims->max_time) + " (log_probs' dim 0)");
  if (!error.empty()) return error;

  std::vector<int64_t>& offsets = indices->view.label_offsets;
  offsets.assign(static_cast<size_t>(batch), 0);
  if (targets.shape.size() == 2) {
    if (targets.shape[0] != batch) {
      return "targets: expected shape [N=" + std::to_string(batch) + ", S] (padded), got " + FormatShape(targets.shape);
    }
    dims->max_target_length = targets.shape[1];
    error = CheckLengths(indices->target_lengths, "target_lengths", dims->max_target_length,
                         "S=" + std::to_string(dims->max_target_length) + " (padded targets' dim 1)");
    if (!error.empty()) return error;
    for (int64_t n = 0; n < batch; ++n) offsets[static_cast<size_t>(n)] = n * dims->max_target_length;
  } else if (targets.shape.size() == 1) {
    int64_t total = 0;
    dims->max_target_length = 0;
    for (int64_t n = 0; n < batch; ++n) {
      const int64_t length = indices->target_lengths[static_cast<size_t>(n)];
      if (length < 0) {
        return "target_lengths[" + std::to_string(n) + "]: expected a value >= 0, got " + std::to_string(length);
      }
      offsets[static_cast<size_t>(n)] = total;
      // Each length is at most targets' size when the sum matches, so the sum cannot wrap before the check.
      if (length > targets.shape[0] - total) {
        total = -1;
        break;
      }
      total += length;
      dims->max_target_length = std::max(dims->max_target_length, length);
    }
    if (total != targets.shape[0]) {
      int64_t sum = 0;
      bool overflow = false;
      for (const int64_t length : indices->target_lengths)
        overflow = overflow || __builtin_add_overflow(sum, length, &sum);
      return "targets: expected shape [sum(target_lengths)=" +
             (overflow ? std::string("overflow") : std::to_string(sum)) + "] (concatenated), got " +
             FormatShape(targets.shape);
    }
  } else {
    return "targets: expected rank 2 [N, S] (padded) or rank 1 [sum(target_lengths)] (concatenated), got shape " +
           FormatShape(targets.shape);
  }
  // log_alpha [N, T, 2*S+1] and the gradient must fit in one buffer.
  if (dims->max_target_length > (limits::kMaxBufferElements - 1) / 2 ||
      !CheckedProduct(std::vector<int64_t>{batch, dims->max_time, dims->NumStates()}, limits::kMaxBufferElements)) {
    return "targets: log_alpha [N, T, 2*S+1] with S=" + std::to_string(dims->max_target_length) +
           " would hold more than " + std::to_string(limits::kMaxBufferElements) + " elements";
  }
  for (int64_t n = 0; n < batch; ++n) {
    const int64_t* label = indices->labels.data() + offsets[static_cast<size_t>(n)];
    for (int64_t i = 0; i < indices->target_lengths[static_cast<size_t>(n)]; ++i) {
      if (label[i] < 0 || label[i] >= dims->num_classes || label[i] == blank) {
        std::ostringstream msg;
        msg << "targets: sample " << n << ", position " << i << ": expected a label in [0, C=" << dims->num_classes
            << ") other than blank=" << blank << ", got " << label[i];
        return msg.str();
      }
    }
  }
  indices->view.labels = indices->labels.data();
  indices->view.input_lengths = indices->input_lengths.data();
  indices->view.target_lengths = indices->target_lengths.data();
  return "";
}

std::string ValidateCtcGradInputs(const ctc::CtcDims& dims, const TensorArg& grad_loss, const TensorArg& loss,
                                  const TensorArg& log_alpha) {
  const std::string batch_text = "[N=" + std::to_string(dims.batch_size) + "]";
  std::string error = ExpectShape(grad_loss, "grad_loss", {dims.batch_size}, batch_text);
  if (error.empty()) error = ExpectShape(loss, "loss", {dims.batch_size}, batch_text);
  if (error.empty()) {
    error = ExpectShape(log_alpha, "log_alpha", {dims.batch_size, dims.max_time, dims.NumStates()},
                        "[N=" + std::to_string(dims.batch_size) + ", T=" + std::to_string(dims.max_time) +
                            ", 2*S+1=" + std::to_string(dims.NumStates()) + "] (CTCLoss's output)");
  }
  return error;
}

}  // namespace ortlstm::ort
