// Shape and value checks for both ops. Dims are read from X (and the attributes), then every
// other tensor is compared with the shape those dims imply.
#include "ort/lstm_validation.h"

#include <climits>
#include <cstdint>
#include <sstream>

namespace ortlstm::ort {
namespace {

struct Dim {
  const char* label;  // ONNX dim name or expression, e.g. "4*hidden_size"
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

std::vector<Dim> SequenceDims(const LstmDims& dims, const char* width_label, int64_t width) {
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

std::string ValidateCommon(const LstmConfig& config, const CommonInputs& in, LstmDims* dims) {
  LstmDims d;
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

  // BLAS takes 32-bit dimensions and leading dimensions.
  const int64_t width = d.GateWidth();
  if (d.seq_length * d.batch_size > INT_MAX || d.seq_length * width > INT_MAX || d.input_size > INT_MAX ||
      width > INT_MAX) {
    std::ostringstream msg;
    msg << "X: seq_length*batch_size=" << d.seq_length * d.batch_size << ", seq_length*4*hidden_size="
        << d.seq_length * width << ", input_size=" << d.input_size << ": each must be at most " << INT_MAX
        << ", the largest dimension BLAS accepts";
    return msg.str();
  }

  const std::string directions_label =
      std::string("num_directions(direction=") +
      (config.direction == Direction::kBidirectional ? "bidirectional"
                                                     : (config.direction == Direction::kReverse ? "reverse" : "forward")) +
      ")";
  std::string error =
      CheckShape("W", in.W, {{directions_label.c_str(), d.num_directions}, {"4*hidden_size", width}, {"input_size", d.input_size}});
  if (error.empty()) {
    error = CheckShape("R", in.R,
                       {{directions_label.c_str(), d.num_directions}, {"4*hidden_size", width}, {"hidden_size", d.hidden_size}});
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

}  // namespace ortlstm::ort
