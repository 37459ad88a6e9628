// RNNTraining and RNNGrad as ORT custom ops. Port counts, order and optionality come from the
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
#include "ort/schema_op.h"
#include "rnn/rnn_math.h"

namespace ortlstm::ort {
namespace {

template <typename T>
class RnnTrainingKernel {
 public:
  RnnTrainingKernel(const LstmConfig& config, std::string node) : config_(config), node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    namespace spec = schema::rnn_training;
    using In = spec::In;
    using Out = spec::Out;
    try {
      RnnTrainingInputs inputs;
      std::string error = ReadInputs(context, &inputs, spec::kInputOptional, spec::kInputNames);
      LstmDims dims;
      if (error.empty()) error = ValidateRnnTrainingInputs(config_, inputs, &dims);
      if (!error.empty()) return Fail(spec::kName, node_, error);
      auto in = [&](In port) { return inputs[spec::Index(port)].template Data<T>(); };
      std::array<void*, spec::kNumOutputs> out{};
      const std::array<std::pair<Out, std::vector<int64_t>>, spec::kNumOutputs> shapes = {{
          {Out::kHAll, SequenceShape(dims, dims.hidden_size)},
          {Out::kHt, StateShape(dims)},
      }};
      for (const auto& [port, shape] : shapes) {
        error = AllocateOutput(context, spec::Index(port), shape, &out[spec::Index(port)]);
        if (!error.empty()) return Fail(spec::kName, node_, spec::kOutputNames[spec::Index(port)] + (": " + error));
      }
      RnnForwardTensors<T> t;
      t.X = in(In::kX);
      t.W = in(In::kW);
      t.R = in(In::kR);
      t.B = in(In::kB);
      t.sequence_lens = inputs[spec::Index(In::kSequenceLens)].template Data<int32_t>();
      t.initial_h = in(In::kInitialH);
      t.HAll = static_cast<T*>(out[spec::Index(Out::kHAll)]);
      t.Ht = static_cast<T*>(out[spec::Index(Out::kHt)]);
      RnnForward<T>(dims, config_, t, OrtExecutor(context), OrtScratchAllocator(context));
      return nullptr;
    } catch (const std::bad_alloc&) {
      return OutOfMemory(spec::kName, node_);
    }
  }

 private:
  LstmConfig config_;
  std::string node_;
};

template <typename T>
class RnnGradKernel {
 public:
  RnnGradKernel(const LstmConfig& config, std::string node) : config_(config), node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    namespace spec = schema::rnn_grad;
    using In = spec::In;
    using Out = spec::Out;
    try {
      RnnGradInputs inputs;
      std::string error = ReadInputs(context, &inputs, spec::kInputOptional, spec::kInputNames);
      LstmDims dims;
      if (error.empty()) error = ValidateRnnGradInputs(config_, inputs, &dims);
      if (!error.empty()) return Fail(spec::kName, node_, error);
      auto in = [&](In port) { return inputs[spec::Index(port)].template Data<T>(); };
      const int64_t H = dims.hidden_size;
      std::array<void*, spec::kNumOutputs> out{};
      const std::array<std::pair<Out, std::vector<int64_t>>, spec::kNumOutputs> shapes = {{
          {Out::kDX, InputShape(dims)},
          {Out::kDW, {dims.num_directions, H, dims.input_size}},
          {Out::kDR, {dims.num_directions, H, H}},
          {Out::kDB, {dims.num_directions, 2 * H}},
          {Out::kDH0, StateShape(dims)},
      }};
      for (const auto& [port, shape] : shapes) {
        error = AllocateOutput(context, spec::Index(port), shape, &out[spec::Index(port)]);
        if (!error.empty()) return Fail(spec::kName, node_, spec::kOutputNames[spec::Index(port)] + (": " + error));
      }
      RnnBackwardTensors<T> t;
      t.X = in(In::kX);
      t.W = in(In::kW);
      t.R = in(In::kR);
      t.B = in(In::kB);
      t.sequence_lens = inputs[spec::Index(In::kSequenceLens)].template Data<int32_t>();
      t.initial_h = in(In::kInitialH);
      t.HAll = in(In::kHAll);
      t.grad_HAll = in(In::kGradHAll);
      t.grad_Ht = in(In::kGradHt);
      t.dX = static_cast<T*>(out[spec::Index(Out::kDX)]);
      t.dW = static_cast<T*>(out[spec::Index(Out::kDW)]);
      t.dR = static_cast<T*>(out[spec::Index(Out::kDR)]);
      t.dB = static_cast<T*>(out[spec::Index(Out::kDB)]);
      t.dH0 = static_cast<T*>(out[spec::Index(Out::kDH0)]);
      RnnBackward<T>(dims, config_, t, OrtExecutor(context), OrtScratchAllocator(context));
      return nullptr;
    } catch (const std::bad_alloc&) {
      return OutOfMemory(spec::kName, node_);
    }
  }

 private:
  LstmConfig config_;
  std::string node_;
};

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
  static constexpr const char* kName = schema::rnn_training::kName;
  static constexpr int kNumInputs = schema::rnn_training::kNumInputs;
  static constexpr int kNumOutputs = schema::rnn_training::kNumOutputs;
  static constexpr const bool* kInputOptional = schema::rnn_training::kInputOptional;
  static constexpr const bool* kInputIsInt32 = schema::rnn_training::kInputIsInt32;
  static constexpr const bool* kOutputOptional = schema::rnn_training::kOutputOptional;
  template <typename T>
  using Kernel = RnnTrainingKernel<T>;
};

struct GradSpec {
  static constexpr const char* kName = schema::rnn_grad::kName;
  static constexpr int kNumInputs = schema::rnn_grad::kNumInputs;
  static constexpr int kNumOutputs = schema::rnn_grad::kNumOutputs;
  static constexpr const bool* kInputOptional = schema::rnn_grad::kInputOptional;
  static constexpr const bool* kInputIsInt32 = schema::rnn_grad::kInputIsInt32;
  static constexpr const bool* kOutputOptional = schema::rnn_grad::kOutputOptional;
  template <typename T>
  using Kernel = RnnGradKernel<T>;
};

template <typename Spec, typename T>
struct RnnOp : SchemaOp<RnnOp<Spec, T>, typename Spec::template Kernel<T>, Spec, T> {
  OrtStatus* CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    const std::string node = NodeName(info);
    LstmConfig config;
    const bool grad = std::string(Spec::kName) == schema::rnn_grad::kName;
    std::string error = ReadRnnConfig(info, grad, &config);
    if (error.empty()) error = RefuseBf16Tensors<T>(config.matmul_precision);
    // RNNGrad's GEMMs run bfloat16 (rnn/rnn_backward.cc); RNNTraining's forward does once it runs on
    // the shared forward driver (task rnndriver): until then it is refused rather than run in float32.
    if (error.empty() && !grad && config.matmul_precision == MatmulPrecision::kBfloat16) {
      error = "attribute matmul_precision: bfloat16 is not yet supported by RNNTraining (its forward runs float32 "
              "GEMMs until it moves onto the shared recurrent driver, issue 33); pass matmul_precision=\"float32\" "
              "or omit it (LSTMTraining, GRUTraining and RNNGrad run bfloat16)";
    }
    if (!error.empty()) return Fail(Spec::kName, node, error);
    return RnnOp::NewKernel(kernel, config, node);
  }

  ONNXTensorElementDataType GetInputType(size_t index) const {
    return Spec::kInputIsInt32[index] ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : kElementType<T>;
  }
};

// Static storage: ORT keeps pointers to the op definitions for the life of every session.
RnnOp<TrainingSpec, float> g_training_float;
RnnOp<TrainingSpec, double> g_training_double;
RnnOp<GradSpec, float> g_grad_float;
RnnOp<GradSpec, double> g_grad_double;

}  // namespace

std::string AddRnnOps(OrtCustomOpDomain* domain) {
  return AddOps(domain, {&g_training_float, &g_training_double, &g_grad_float, &g_grad_double});
}

}  // namespace ortlstm::ort
