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
#include "ort/schema_op.h"

namespace ortlstm::ort {
namespace {

template <typename T>
class GruTrainingKernel {
 public:
  GruTrainingKernel(const GruConfig& config, std::string node) : config_(config), node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    namespace spec = schema::gru_training;
    using In = spec::In;
    using Out = spec::Out;
    try {
      GruTrainingInputs inputs;
      std::string error = ReadInputs(context, &inputs, spec::kInputOptional, spec::kInputNames);
      LstmDims dims;
      if (error.empty()) error = ValidateGruTrainingInputs(config_.cell, inputs, &dims);
      if (!error.empty()) return Fail(spec::kName, node_, error);
      auto in = [&](In port) { return inputs[spec::Index(port)].template Data<T>(); };
      std::array<void*, spec::kNumOutputs> out{};
      const std::array<std::pair<Out, std::vector<int64_t>>, spec::kNumOutputs> shapes = {{
          {Out::kHAll, SequenceShape(dims, dims.hidden_size)},
          {Out::kHt, StateShape(dims)},
          {Out::kZRH, SequenceShape(dims, dims.GateWidth())},
      }};
      for (const auto& [port, shape] : shapes) {
        error = AllocateOutput(context, spec::Index(port), shape, &out[spec::Index(port)]);
        if (!error.empty()) return Fail(spec::kName, node_, spec::kOutputNames[spec::Index(port)] + (": " + error));
      }
      GruForwardTensors<T> t;
      t.X = in(In::kX);
      t.W = in(In::kW);
      t.R = in(In::kR);
      t.B = in(In::kB);
      t.sequence_lens = inputs[spec::Index(In::kSequenceLens)].template Data<int32_t>();
      t.initial_h = in(In::kInitialH);
      t.HAll = static_cast<T*>(out[spec::Index(Out::kHAll)]);
      t.Ht = static_cast<T*>(out[spec::Index(Out::kHt)]);
      t.ZRH = static_cast<T*>(out[spec::Index(Out::kZRH)]);
      GruForward<T>(dims, config_, t, OrtExecutor(context), OrtScratchAllocator(context));
      return nullptr;
    } catch (const std::bad_alloc&) {
      return OutOfMemory(spec::kName, node_);
    }
  }

 private:
  GruConfig config_;
  std::string node_;
};

template <typename T>
class GruGradKernel {
 public:
  GruGradKernel(const GruConfig& config, std::string node) : config_(config), node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    namespace spec = schema::gru_grad;
    using In = spec::In;
    using Out = spec::Out;
    try {
      GruGradInputs inputs;
      std::string error = ReadInputs(context, &inputs, spec::kInputOptional, spec::kInputNames);
      LstmDims dims;
      if (error.empty()) error = ValidateGruGradInputs(config_.cell, inputs, &dims);
      if (!error.empty()) return Fail(spec::kName, node_, error);
      auto in = [&](In port) { return inputs[spec::Index(port)].template Data<T>(); };
      const int64_t width = dims.GateWidth();
      std::array<void*, spec::kNumOutputs> out{};
      const std::array<std::pair<Out, std::vector<int64_t>>, spec::kNumOutputs> shapes = {{
          {Out::kDX, InputShape(dims)},
          {Out::kDW, {dims.num_directions, width, dims.input_size}},
          {Out::kDR, {dims.num_directions, width, dims.hidden_size}},
          {Out::kDB, {dims.num_directions, 2 * width}},
          {Out::kDH0, StateShape(dims)},
      }};
      for (const auto& [port, shape] : shapes) {
        error = AllocateOutput(context, spec::Index(port), shape, &out[spec::Index(port)]);
        if (!error.empty()) return Fail(spec::kName, node_, spec::kOutputNames[spec::Index(port)] + (": " + error));
      }
      GruBackwardTensors<T> t;
      t.X = in(In::kX);
      t.W = in(In::kW);
      t.R = in(In::kR);
      t.B = in(In::kB);
      t.sequence_lens = inputs[spec::Index(In::kSequenceLens)].template Data<int32_t>();
      t.initial_h = in(In::kInitialH);
      t.HAll = in(In::kHAll);
      t.ZRH = in(In::kZRH);
      t.grad_HAll = in(In::kGradHAll);
      t.grad_Ht = in(In::kGradHt);
      t.dX = static_cast<T*>(out[spec::Index(Out::kDX)]);
      t.dW = static_cast<T*>(out[spec::Index(Out::kDW)]);
      t.dR = static_cast<T*>(out[spec::Index(Out::kDR)]);
      t.dB = static_cast<T*>(out[spec::Index(Out::kDB)]);
      t.dH0 = static_cast<T*>(out[spec::Index(Out::kDH0)]);
      GruBackward<T>(dims, config_, t, OrtExecutor(context), OrtScratchAllocator(context));
      return nullptr;
    } catch (const std::bad_alloc&) {
      return OutOfMemory(spec::kName, node_);
    }
  }

 private:
  GruConfig config_;
  std::string node_;
};

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
  for (int64_t d = 0; gradient && error.empty() && d < config->cell.num_directions; ++d) {
    for (const Activation* act : {&config->cell.activations[d].f, &config->cell.activations[d].g}) {
      if (error.empty() && !DerivativeDeterminedByOutput(*act)) {
        error = std::string("attribute activation_alpha: ") + ActivationName(act->kind) + " with alpha=" +
                std::to_string(act->alpha) +
                " maps negative and positive inputs onto the same outputs, so GRUGrad cannot recover its derivative "
                "from the stashed gates; use alpha >= 0";
      }
    }
  }
  return error;
}

struct TrainingSpec {
  static constexpr const char* kName = schema::gru_training::kName;
  static constexpr int kNumInputs = schema::gru_training::kNumInputs;
  static constexpr int kNumOutputs = schema::gru_training::kNumOutputs;
  static constexpr const bool* kInputOptional = schema::gru_training::kInputOptional;
  static constexpr const bool* kInputIsInt32 = schema::gru_training::kInputIsInt32;
  static constexpr const bool* kOutputOptional = schema::gru_training::kOutputOptional;
  template <typename T>
  using Kernel = GruTrainingKernel<T>;
};

struct GradSpec {
  static constexpr const char* kName = schema::gru_grad::kName;
  static constexpr int kNumInputs = schema::gru_grad::kNumInputs;
  static constexpr int kNumOutputs = schema::gru_grad::kNumOutputs;
  static constexpr const bool* kInputOptional = schema::gru_grad::kInputOptional;
  static constexpr const bool* kInputIsInt32 = schema::gru_grad::kInputIsInt32;
  static constexpr const bool* kOutputOptional = schema::gru_grad::kOutputOptional;
  template <typename T>
  using Kernel = GruGradKernel<T>;
};

template <typename Spec, typename T>
struct GruOp : SchemaOp<GruOp<Spec, T>, typename Spec::template Kernel<T>, Spec, T> {
  OrtStatus* CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    const std::string node = NodeName(info);
    GruConfig config;
    const std::string error = ReadGruConfig(info, std::string(Spec::kName) == schema::gru_grad::kName, &config);
    if (!error.empty()) return Fail(Spec::kName, node, error);
    return GruOp::NewKernel(kernel, config, node);
  }

  ONNXTensorElementDataType GetInputType(size_t index) const {
    return Spec::kInputIsInt32[index] ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : kElementType<T>;
  }
};

// Static storage: ORT keeps pointers to the op definitions for the life of every session.
GruOp<TrainingSpec, float> g_training_float;
GruOp<TrainingSpec, double> g_training_double;
GruOp<GradSpec, float> g_grad_float;
GruOp<GradSpec, double> g_grad_double;

}  // namespace

std::string AddGruOps(OrtCustomOpDomain* domain) {
  return AddOps(domain, {&g_training_float, &g_training_double, &g_grad_float, &g_grad_double});
}

}  // namespace ortlstm::ort
