// GRUTraining and GRUGrad as ORT custom ops. Port counts, order and optionality come from the
// generated schema (generated/op_schema.h); attributes are read as the LSTM ops read theirs
// (ReadLstmAttributes, ParseRecurrentConfig with two activations per direction) plus
// linear_before_reset. ORT's static shape inference hook is not installed (the onnx schema in
// ops/onnx_defs.py infers shapes for onnx tools); outputs get their shapes when run.
#include "ort/gru_ops.h"

#include <array>
#include <string>
#include <vector>

#include "generated/op_schema.h"
#include "gru/gru_math.h"
#include "ort/lstm_validation.h"
#include "ort/recurrent_kernel.h"

namespace ortlstm::ort {
namespace {

// The attributes of a GRU node: the LSTM ops' reader and rules (two activations per direction)
// plus linear_before_reset. The gradient op also needs activations whose output determines their
// derivative, as GRUGrad reads the stashed activated gates.
std::string ReadGruConfig(const OrtKernelInfo* info, bool gradient, GruConfig* config) {
  RawLstmAttributes raw;
  std::string error = ReadLstmAttributes(info, &raw);
  if (error.empty() && raw.input_forget) {
    error = "attribute input_forget: the GRU has none (it is ONNX LSTM's); remove it";
  }
  if (error.empty()) error = ParseRecurrentConfig(raw, 2, &config->cell);
  int64_t linear_before_reset = 0;
  if (error.empty()) {
    error = ReadIntAttribute(info, schema::gru_training::kAttrLinearBeforeReset, 0, &linear_before_reset);
  }
  if (error.empty() && linear_before_reset != 0 && linear_before_reset != 1) {
    return std::string("attribute linear_before_reset: expected ") +
           schema::gru_training::kAttrLinearBeforeResetAccepts + ", got " + std::to_string(linear_before_reset);
  }
  config->linear_before_reset = linear_before_reset == 1;
  if (error.empty() && gradient) error = CheckGradientActivations(config->cell, schema::gru_grad::kName);
  return error;
}

struct TrainingSpec {
  ORTLSTM_SCHEMA_TRAITS(schema::gru_training)
  using Config = GruConfig;
  // No static shape inference in ORT (see the top of this file).
  static constexpr OrtStatus* (*kInfer)(const OrtCustomOp*, OrtShapeInferContext*) = nullptr;
  static std::string ReadConfig(const OrtKernelInfo* info, Config* config) {
    return ReadGruConfig(info, false, config);
  }
  static std::string Validate(const Config& config, const GruTrainingInputs& inputs, LstmDims* dims) {
    return ValidateGruTrainingInputs(config.cell, inputs, dims);
  }
  static std::array<std::vector<int64_t>, kNumOutputs> OutputShapes(const LstmDims& dims) {
    // HAll, Ht, ZRH
    return {SequenceShape(dims, dims.hidden_size), StateShape(dims), SequenceShape(dims, dims.GateWidth())};
  }
  template <typename T>
  static void Run(const LstmDims& dims, const Config& config, const RecurrentPorts<TrainingSpec>& ports,
                  const Executor& executor, const ScratchAllocator& allocator) {
    GruForwardTensors<T> t;
    BindTrainingPorts<T>(ports, &t);
    t.ZRH = ports.Out<T>(Out::kZRH);
    GruForward<T>(dims, config, t, executor, allocator);
  }
};

struct GradSpec {
  ORTLSTM_SCHEMA_TRAITS(schema::gru_grad)
  using Config = GruConfig;
  static constexpr OrtStatus* (*kInfer)(const OrtCustomOp*, OrtShapeInferContext*) = nullptr;
  static std::string ReadConfig(const OrtKernelInfo* info, Config* config) {
    return ReadGruConfig(info, true, config);
  }
  static std::string Validate(const Config& config, const GruGradInputs& inputs, LstmDims* dims) {
    return ValidateGruGradInputs(config.cell, inputs, dims);
  }
  static std::array<std::vector<int64_t>, kNumOutputs> OutputShapes(const LstmDims& dims) {
    return HiddenStateGradShapes(dims);
  }
  template <typename T>
  static void Run(const LstmDims& dims, const Config& config, const RecurrentPorts<GradSpec>& ports,
                  const Executor& executor, const ScratchAllocator& allocator) {
    GruBackwardTensors<T> t;
    BindGradPorts<T>(ports, &t);
    t.B = ports.In<T>(In::kB);
    t.ZRH = ports.In<T>(In::kZRH);
    GruBackward<T>(dims, config, t, executor, allocator);
  }
};

}  // namespace

std::string AddGruOps(OrtCustomOpDomain* domain) {
  return RecurrentOps<TrainingSpec, GradSpec>::Add(domain, false);
}

}  // namespace ortlstm::ort
