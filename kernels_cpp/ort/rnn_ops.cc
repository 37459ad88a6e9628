// RNNTraining and RNNGrad as ORT custom ops: two Specs of the recurrent ops' shared kernel and op
// definition (ort/recurrent_kernel.h). Port counts, order and optionality come from the
// generated schema (generated/op_schema.h); attributes are read as the LSTM ops read theirs
// (ReadLstmAttributes, ParseRecurrentConfig with one activation per direction, Tanh by default).
// ORT's static shape inference hook is not installed (the onnx schema in ops/onnx_defs.py infers
// shapes for onnx tools); outputs get their shapes when run.
#include "ort/rnn_ops.h"

#include <array>
#include <string>
#include <vector>

#include "generated/op_schema.h"
#include "ort/lstm_validation.h"
#include "ort/recurrent_kernel.h"
#include "rnn/rnn_math.h"

namespace ortlstm::ort {
namespace {

// The attributes of an RNN node: the LSTM ops' reader and rules with one activation per direction
// (ONNX RNN's default Tanh filled in here, as the shared parser's defaults are the LSTM's). The
// gradient op also needs an activation whose output determines its derivative: RNNGrad reads f'
// off HAll.
std::string ReadRnnConfig(const OrtKernelInfo* info, bool gradient, LstmConfig* config) {
  RawLstmAttributes raw;
  std::string error = ReadLstmAttributes(info, &raw);
  if (!error.empty()) return error;
  if (raw.input_forget) return "attribute input_forget: the RNN has none (it is ONNX LSTM's); remove it";
  const size_t num_directions = raw.direction.value_or("forward") == "bidirectional" ? 2 : 1;
  if (!raw.activations || raw.activations->empty()) {
    raw.activations = std::vector<std::string>(num_directions, "Tanh");
  } else if (raw.activations->size() != num_directions) {
    std::string names;
    for (const std::string& name : *raw.activations) names += (names.empty() ? "" : ", ") + name;
    return "attribute " + raw.activations_attribute + ": expected 1*num_directions=" + std::to_string(num_directions) +
           " names (f per direction, direction=" + raw.direction.value_or("forward") + "), got " +
           std::to_string(raw.activations->size()) + " [" + names + "]";
  }
  error = ParseRecurrentConfig(raw, 1, config);
  for (int64_t d = 0; gradient && error.empty() && d < config->num_directions; ++d) {
    const Activation& act = config->activations[d].f;
    if (!DerivativeDeterminedByOutput(act)) {
      error = std::string("attribute activation_alpha: ") + ActivationName(act.kind) + " with alpha=" +
              std::to_string(act.alpha) +
              " maps negative and positive inputs onto the same outputs, so RNNGrad cannot recover its derivative "
              "from HAll; use alpha >= 0";
    }
  }
  return error;
}

struct TrainingSpec {
  ORTLSTM_SCHEMA_TRAITS(schema::rnn_training)
  using Config = LstmConfig;
  // No static shape inference in ORT (see the top of this file).
  static constexpr OrtStatus* (*kInfer)(const OrtCustomOp*, OrtShapeInferContext*) = nullptr;
  static std::string ReadConfig(const OrtKernelInfo* info, Config* config) {
    return ReadRnnConfig(info, false, config);
  }
  static std::string Validate(const Config& config, const RnnTrainingInputs& inputs, LstmDims* dims) {
    return ValidateRnnTrainingInputs(config, inputs, dims);
  }
  static std::array<std::vector<int64_t>, kNumOutputs> OutputShapes(const LstmDims& dims) {
    // HAll, Ht
    return {SequenceShape(dims, dims.hidden_size), StateShape(dims)};
  }
  template <typename T>
  static void Run(const LstmDims& dims, const Config& config, const RecurrentPorts<TrainingSpec>& ports,
                  const Executor& executor, const ScratchAllocator& allocator) {
    RnnForwardTensors<T> t;
    BindTrainingPorts<T>(ports, &t);
    RnnForward<T>(dims, config, t, executor, allocator);
  }
};

struct GradSpec {
  ORTLSTM_SCHEMA_TRAITS(schema::rnn_grad)
  using Config = LstmConfig;
  static constexpr OrtStatus* (*kInfer)(const OrtCustomOp*, OrtShapeInferContext*) = nullptr;
  static std::string ReadConfig(const OrtKernelInfo* info, Config* config) {
    return ReadRnnConfig(info, true, config);
  }
  static std::string Validate(const Config& config, const RnnGradInputs& inputs, LstmDims* dims) {
    return ValidateRnnGradInputs(config, inputs, dims);
  }
  static std::array<std::vector<int64_t>, kNumOutputs> OutputShapes(const LstmDims& dims) {
    return HiddenStateGradShapes(dims);
  }
  template <typename T>
  static void Run(const LstmDims& dims, const Config& config, const RecurrentPorts<GradSpec>& ports,
                  const Executor& executor, const ScratchAllocator& allocator) {
    RnnBackwardTensors<T> t;
    BindGradPorts<T>(ports, &t);
    t.B = ports.In<T>(In::kB);
    RnnBackward<T>(dims, config, t, executor, allocator);
  }
};

}  // namespace

std::string AddRnnOps(OrtCustomOpDomain* domain) {
  return RecurrentOps<TrainingSpec, GradSpec>::Add(domain, false);
}

}  // namespace ortlstm::ort
