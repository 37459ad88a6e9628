// Shape and value checks for both ops. Dims are read from X (and the attributes), then every
// other tensor is compared with the shape those dims imply.
#include "ort/lstm_validation.h"

#include <climits>
#include <cstdint>
#include <sstream>

#include "common/checked_math.h"

namespace ortlstm::ort {
namespace {

namespace limits = schema::limits;
// blas.h passes sizes to BLAS as int.
static_assert(limits::kBlasDim == INT_MAX, "ops/schema.py BLAS_DIM_LIMIT must be the largest int");
// With batch_size and hidden_size in range, the [2, batch_size, hidden_size] state buffers fit
// whatever seq_length is; the larger buffers are checked per call (ValidateSizes).
static_assert(2 * limits::kBlasDim * limits::kMaxHiddenSize <= limits::kMaxBufferElements,
              "state buffers must fit by the attribute and BLAS limits alone");

// A product of dims as the message shows it.
struct Quantity {
  std::string label;  // e.g. "seq_length*4*hidden_size"
  std::vector<int64_t> factors;
};

// The exact value of a product of dims, also when it exceeds 64 bits (for messages only).
std::string ProductText(const std::vector<int64_t>& factors) {
  unsigned __int128 product = 1;
  for (const int64_t factor : factors) {
    if (factor < 0) return "a negative value";
    if (__builtin_mul_overflow(product, static_cast<unsigned __int128>(factor), &product)) return "more than 2**128";
  }
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(product % 10)));
    product /= 10;
  } while (product != 0);
  return digits;
}

// Refuses dims that BLAS's 32-bit sizes, or any buffer the ops form, cannot hold. Every product
// goes through CheckedProduct, so none wraps (X of shape [2**62, 0, 1] once passed as
// seq_length*4*hidden_size = 0 and looped over 2**62 empty steps).
std::string ValidateSizes(const LstmDims& d) {
  // Each of these is a GEMM dimension or leading dimension somewhere (lstm/lstm_dims.h). batch_size
  // is bounded on its own because seq_length = 0 zeroes seq_length*batch_size; seq_length is
  // bounded by seq_length*4*hidden_size, as hidden_size >= 1.
  const std::string gates = std::to_string(d.gates);
  const Quantity blas[] = {
      {"seq_length*batch_size", {d.seq_length, d.batch_size}},
      {"seq_length*" + gates + "*hidden_size", {d.seq_length, d.gates, d.hidden_size}},
      {"batch_size", {d.batch_size}},
      {"input_size", {d.input_size}},
  };
  bool fits = true;
  for (const Quantity& quantity : blas) fits = fits && CheckedProduct(quantity.factors, limits::kBlasDim).has_value();
  if (!fits) {
    std::ostringstream msg;
    msg << "X: ";
    for (const Quantity& quantity : blas) {
      msg << (&quantity == blas ? "" : ", ") << quantity.label << "=" << ProductText(quantity.factors);
    }
    msg << ": each must be at most " << limits::kBlasDim << ", the largest dimension BLAS accepts";
    return msg.str();
  }
  // The largest buffers either op forms; every other output or scratch buffer is smaller or has
  // the shape of an input. A window of gate gradients holds at least one step even when
  // seq_length = 0 (lstm_backward.cc), hence the second.
  const Quantity buffers[] = {
      {"[seq_length, num_directions, batch_size, " + gates + "*hidden_size] (" + (d.gates == 4 ? "IOFC" : "ZRH") +
           " and the gate scratch)",
       {d.seq_length, d.num_directions, d.batch_size, d.gates, d.hidden_size}},
      {"[batch_size, " + gates + "*hidden_size] (one step's gates)", {d.batch_size, d.gates, d.hidden_size}},
  };
  for (const Quantity& buffer : buffers) {
    if (!CheckedProduct(buffer.factors, limits::kMaxBufferElements)) {
      return std::string("X: ") + buffer.label + " would hold " + ProductText(buffer.factors) +
             " elements, more than " + std::to_string(limits::kMaxBufferElements) +
             ", the most one buffer may hold (2**63 bytes of float64)";
    }
  }
  return "";
}

struct Dim {
  std::string label;  // ONNX dim name or expression, e.g. "4*hidden_size"
  int64_t value;
};

std::string CheckShape(const char* name, const TensorArg& arg, const std::vector<Dim>& expected) {
  bool ok = arg.shape.size() == expected.size();
  for (size_t i = 0; ok && i < expected.size(); ++i) ok = arg.shape[i] == expected[i].value;
  if (ok) return "";
  std::ostringstream msg;
  msg << name << ": expected [";
  for (size_t i = 0; i < expected.size(); ++i) {
    msg << (i ? ", " : "") << expected[i].label << "=" << expected[i].value;
  }
  msg << "], got " << FormatShape(arg.shape);
  return msg.str();
}

std::vector<Dim> SequenceDims(const LstmDims& dims, const std::string& width_label, int64_t width) {
  if (dims.layout == 0) {
    return {{"seq_length", dims.seq_length},
            {"num_directions", dims.num_directions},
            {"batch_size", dims.batch_size},
            {width_label, width}};
  }
  return {{"batch_size", dims.batch_size},
          {"seq_length", dims.seq_length},
          {"num_directions", dims.num_directions},
          {width_label, width}};
}

std::vector<Dim> StateDims(const LstmDims& dims) {
  if (dims.layout == 0) {
    return {{"num_directions", dims.num_directions}, {"batch_size", dims.batch_size}, {"hidden_size", dims.hidden_size}};
  }
  return {{"batch_size", dims.batch_size}, {"num_directions", dims.num_directions}, {"hidden_size", dims.hidden_size}};
}

// The inputs both ops share.
struct CommonInputs {
  const TensorArg& X;
  const TensorArg& W;
  const TensorArg& R;
  const TensorArg& sequence_lens;
  const TensorArg& initial_h;
  const TensorArg& initial_c;
  const TensorArg& P;
};

// `gates`: 4 for the LSTM, 3 for the GRU, 1 for the RNN (whose initial_c and P are never present).
std::string ValidateCommon(const LstmConfig& config, const CommonInputs& in, LstmDims* dims, int64_t gates = 4) {
  LstmDims d;
  d.gates = gates;
  d.layout = config.layout;
  d.hidden_size = config.hidden_size;
  d.num_directions = config.num_directions;
  if (in.X.shape.size() != 3) {
    return std::string("X: expected rank 3 ") +
           (config.layout == 0 ? "[seq_length, batch_size, input_size]" : "[batch_size, seq_length, input_size]") +
           " (layout=" + std::to_string(config.layout) + "), got rank " + std::to_string(in.X.shape.size()) + " " +
           FormatShape(in.X.shape);
  }
  d.seq_length = config.layout == 0 ? in.X.shape[0] : in.X.shape[1];
  d.batch_size = config.layout == 0 ? in.X.shape[1] : in.X.shape[0];
  d.input_size = in.X.shape[2];

  // Before any product of dims is formed below or in the math.
  if (std::string error = ValidateSizes(d); !error.empty()) return error;
  const int64_t width = d.GateWidth();

  const std::string directions_label =
      std::string("num_directions(direction=") +
      (config.direction == Direction::kBidirectional ? "bidirectional"
                                                     : (config.direction == Direction::kReverse ? "reverse" : "forward")) +
      ")";
  const std::string width_label = gates == 1 ? "hidden_size" : std::to_string(gates) + "*hidden_size";
  std::string error =
      CheckShape("W", in.W, {{directions_label, d.num_directions}, {width_label, width}, {"input_size", d.input_size}});
  if (error.empty()) {
    error = CheckShape("R", in.R,
                       {{directions_label, d.num_directions}, {width_label, width}, {"hidden_size", d.hidden_size}});
  }
  if (error.empty() && in.sequence_lens.present) {
    error = CheckShape("sequence_lens", in.sequence_lens, {{"batch_size", d.batch_size}});
    if (error.empty()) {
      const int32_t* lens = in.sequence_lens.Data<int32_t>();
      for (int64_t b = 0; b < d.batch_size; ++b) {
        if (lens[b] < 0 || lens[b] > d.seq_length) {
          return "sequence_lens: every value must be in [0, seq_length=" + std::to_string(d.seq_length) + "], got " +
                 std::to_string(lens[b]) + " at index " + std::to_string(b);
        }
      }
    }
  }
  if (error.empty() && in.initial_h.present) error = CheckShape("initial_h", in.initial_h, StateDims(d));
  if (error.empty() && in.initial_c.present) error = CheckShape("initial_c", in.initial_c, StateDims(d));
  if (error.empty() && in.P.present) {
    error = CheckShape("P", in.P, {{"num_directions", d.num_directions}, {"3*hidden_size", 3 * d.hidden_size}});
  }
  *dims = d;
  return error;
}

// The inputs of a cell without c or peepholes (GRU, RNN): the shared checks, then B [D, 2*gates*H].
struct CellInputs {
  const TensorArg& X;
  const TensorArg& W;
  const TensorArg& R;
  const TensorArg& sequence_lens;
  const TensorArg& initial_h;
};

std::string ValidateCell(const LstmConfig& config, const CellInputs& in, const TensorArg& B, int64_t gates,
                         LstmDims* dims) {
  const TensorArg absent;
  std::string error =
      ValidateCommon(config, {in.X, in.W, in.R, in.sequence_lens, in.initial_h, absent, absent}, dims, gates);
  if (error.empty() && B.present) {
    error = CheckShape("B", B, {{"num_directions", dims->num_directions},
                                {std::to_string(2 * gates) + "*hidden_size", 2 * gates * dims->hidden_size}});
  }
  return error;
}

}  // namespace

std::string ValidateTrainingInputs(const LstmConfig& config, const TrainingInputs& inputs, LstmDims* dims) {
  using In = schema::lstm_training::In;
  auto at = [&](In port) -> const TensorArg& { return inputs[schema::lstm_training::Index(port)]; };
  std::string error = ValidateCommon(
      config, {at(In::kX), at(In::kW), at(In::kR), at(In::kSequenceLens), at(In::kInitialH), at(In::kInitialC), at(In::kP)},
      dims);
  if (error.empty() && at(In::kB).present) {
    error = CheckShape("B", at(In::kB), {{"num_directions", dims->num_directions}, {"8*hidden_size", 8 * dims->hidden_size}});
  }
  return error;
}

std::string ValidateGradInputs(const LstmConfig& config, const GradInputs& inputs, LstmDims* dims) {
  using In = schema::lstm_grad::In;
  auto at = [&](In port) -> const TensorArg& { return inputs[schema::lstm_grad::Index(port)]; };
  std::string error = ValidateCommon(
      config, {at(In::kX), at(In::kW), at(In::kR), at(In::kSequenceLens), at(In::kInitialH), at(In::kInitialC), at(In::kP)},
      dims);
  if (!error.empty()) return error;
  const auto hidden_dims = SequenceDims(*dims, "hidden_size", dims->hidden_size);
  error = CheckShape("HAll", at(In::kHAll), hidden_dims);
  if (error.empty()) error = CheckShape("CAll", at(In::kCAll), hidden_dims);
  if (error.empty()) error = CheckShape("IOFC", at(In::kIOFC), SequenceDims(*dims, "4*hidden_size", dims->GateWidth()));
  if (error.empty() && at(In::kGradHAll).present) error = CheckShape("grad_HAll", at(In::kGradHAll), hidden_dims);
  if (error.empty() && at(In::kGradHt).present) error = CheckShape("grad_Ht", at(In::kGradHt), StateDims(*dims));
  if (error.empty() && at(In::kGradCt).present) error = CheckShape("grad_Ct", at(In::kGradCt), StateDims(*dims));
  return error;
}

std::string ValidateGruTrainingInputs(const LstmConfig& config, const GruTrainingInputs& inputs, LstmDims* dims) {
  using In = schema::gru_training::In;
  auto at = [&](In port) -> const TensorArg& { return inputs[schema::gru_training::Index(port)]; };
  return ValidateCell(config, {at(In::kX), at(In::kW), at(In::kR), at(In::kSequenceLens), at(In::kInitialH)},
                      at(In::kB), 3, dims);
}

std::string ValidateGruGradInputs(const LstmConfig& config, const GruGradInputs& inputs, LstmDims* dims) {
  using In = schema::gru_grad::In;
  auto at = [&](In port) -> const TensorArg& { return inputs[schema::gru_grad::Index(port)]; };
  std::string error = ValidateCell(
      config, {at(In::kX), at(In::kW), at(In::kR), at(In::kSequenceLens), at(In::kInitialH)}, at(In::kB), 3, dims);
  if (!error.empty()) return error;
  const auto hidden_dims = SequenceDims(*dims, "hidden_size", dims->hidden_size);
  error = CheckShape("HAll", at(In::kHAll), hidden_dims);
  if (error.empty()) error = CheckShape("ZRH", at(In::kZRH), SequenceDims(*dims, "3*hidden_size", dims->GateWidth()));
  if (error.empty() && at(In::kGradHAll).present) error = CheckShape("grad_HAll", at(In::kGradHAll), hidden_dims);
  if (error.empty() && at(In::kGradHt).present) error = CheckShape("grad_Ht", at(In::kGradHt), StateDims(*dims));
  return error;
}

std::string ValidateRnnTrainingInputs(const LstmConfig& config, const RnnTrainingInputs& inputs, LstmDims* dims) {
  using In = schema::rnn_training::In;
  auto at = [&](In port) -> const TensorArg& { return inputs[schema::rnn_training::Index(port)]; };
  return ValidateCell(config, {at(In::kX), at(In::kW), at(In::kR), at(In::kSequenceLens), at(In::kInitialH)},
                      at(In::kB), 1, dims);
}

std::string ValidateRnnGradInputs(const LstmConfig& config, const RnnGradInputs& inputs, LstmDims* dims) {
  using In = schema::rnn_grad::In;
  auto at = [&](In port) -> const TensorArg& { return inputs[schema::rnn_grad::Index(port)]; };
  std::string error = ValidateCell(
      config, {at(In::kX), at(In::kW), at(In::kR), at(In::kSequenceLens), at(In::kInitialH)}, at(In::kB), 1, dims);
  if (!error.empty()) return error;
  const auto hidden_dims = SequenceDims(*dims, "hidden_size", dims->hidden_size);
  error = CheckShape("HAll", at(In::kHAll), hidden_dims);
  if (error.empty() && at(In::kGradHAll).present) error = CheckShape("grad_HAll", at(In::kGradHAll), hidden_dims);
  if (error.empty() && at(In::kGradHt).present) error = CheckShape("grad_Ht", at(In::kGradHt), StateDims(*dims));
  return error;
}

std::vector<int64_t> SequenceShape(const LstmDims& dims, int64_t width) {
  if (dims.layout == 0) return {dims.seq_length, dims.num_directions, dims.batch_size, width};
  return {dims.batch_size, dims.seq_length, dims.num_directions, width};
}

std::vector<int64_t> StateShape(const LstmDims& dims) {
  if (dims.layout == 0) return {dims.num_directions, dims.batch_size, dims.hidden_size};
  return {dims.batch_size, dims.num_directions, dims.hidden_size};
}

std::vector<int64_t> InputShape(const LstmDims& dims) {
  if (dims.layout == 0) return {dims.seq_length, dims.batch_size, dims.input_size};
  return {dims.batch_size, dims.seq_length, dims.input_size};
}

std::string CheckGradientActivations(const LstmConfig& config, const char* op_name) {
  for (int64_t d = 0; d < config.num_directions; ++d) {
    for (const Activation* act : {&config.activations[d].f, &config.activations[d].g}) {
      if (!DerivativeDeterminedByOutput(*act)) {
        return std::string("attribute activation_alpha: ") + ActivationName(act->kind) + " with alpha=" +
               std::to_string(act->alpha) + " maps negative and positive inputs onto the same outputs, so " + op_name +
               " cannot recover its derivative from the stashed gates; use alpha >= 0";
      }
    }
  }
  return "";
}

std::array<std::vector<int64_t>, 3> WeightShapes(const LstmDims& dims) {
  const int64_t width = dims.GateWidth();
  return {{{dims.num_directions, width, dims.input_size},
           {dims.num_directions, width, dims.hidden_size},
           {dims.num_directions, 2 * width}}};
}

}  // namespace ortlstm::ort
