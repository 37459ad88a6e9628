// LSTMTraining and LSTMGrad as ORT custom ops. Port counts, order and optionality come from the
// generated schema (generated/op_schema.h); this file only adapts ORT tensors to lstm/ math.
#include "ort/lstm_ops.h"

#include <algorithm>
#include <array>
#include <new>
#include <string>
#include <vector>

#include "generated/op_schema.h"
#include "lstm/lstm_math.h"
#include "ort/lstm_validation.h"

namespace ortlstm::ort {
namespace {

// ---------------------------------------------------------------------------------------------
// Static type and shape inference (runs when ORT resolves the graph).

struct InferDim {
  int64_t value = -1;  // -1: unknown
  std::string symbol;  // symbolic name, if the input had one
};
using InferShape = std::vector<InferDim>;

// Releases `status`; true if it was a success.
bool Ok(OrtStatus* status) {
  if (status == nullptr) return true;
  Api().ReleaseStatus(status);
  return false;
}

const OrtOpAttr* FindAttribute(OrtShapeInferContext* ctx, const char* name) {
  const OrtOpAttr* attr = nullptr;
  if (!Ok(Api().ShapeInferContext_GetAttribute(ctx, name, &attr))) return nullptr;
  return attr;
}

std::optional<int64_t> InferAttrInt(OrtShapeInferContext* ctx, const char* name) {
  const OrtOpAttr* attr = FindAttribute(ctx, name);
  int64_t value = 0;
  size_t size = 0;
  if (attr == nullptr || !Ok(Api().ReadOpAttr(attr, ORT_OP_ATTR_INT, &value, sizeof(value), &size))) {
    return std::nullopt;
  }
  return value;
}

std::optional<std::string> InferAttrString(OrtShapeInferContext* ctx, const char* name) {
  const OrtOpAttr* attr = FindAttribute(ctx, name);
  if (attr == nullptr) return std::nullopt;
  size_t size = 0;
  char probe = 0;
  if (Ok(Api().ReadOpAttr(attr, ORT_OP_ATTR_STRING, &probe, 0, &size)) && size == 0) return std::string();
  std::string value(size, '\0');
  if (!Ok(Api().ReadOpAttr(attr, ORT_OP_ATTR_STRING, value.data(), size, &size))) return std::nullopt;
  value.resize(size);
  while (!value.empty() && value.back() == '\0') value.pop_back();
  return value;
}

// Input `index`'s element type and shape; false when the graph does not say.
bool InferInput(OrtShapeInferContext* ctx, size_t index, ONNXTensorElementDataType* type, InferShape* shape) {
  size_t count = 0;
  if (!Ok(Api().ShapeInferContext_GetInputCount(ctx, &count)) || index >= count) return false;
  OrtTensorTypeAndShapeInfo* info = nullptr;  // owned by the context: never released here
  if (!Ok(Api().ShapeInferContext_GetInputTypeShape(ctx, index, &info)) || info == nullptr) return false;
  size_t rank = 0;
  if (!Ok(Api().GetTensorElementType(info, type)) || !Ok(Api().GetDimensionsCount(info, &rank))) return false;
  std::vector<int64_t> values(rank);
  std::vector<const char*> symbols(rank, nullptr);
  if (rank > 0 && (!Ok(Api().GetDimensions(info, values.data(), rank)) ||
                   !Ok(Api().GetSymbolicDimensions(info, symbols.data(), rank)))) {
    return false;
  }
  shape->clear();
  for (size_t i = 0; i < rank; ++i) {
    InferDim dim;
    dim.value = values[i] >= 0 ? values[i] : -1;
    if (symbols[i] != nullptr) dim.symbol = symbols[i];
    shape->push_back(dim);
  }
  return true;
}

// Sets the shape of output `index`; false if the node has no such output (ORT refuses the index).
// ORT takes only the shape from here (the element type follows the op's type constraints), and
// writes a dim without a symbol as a literal value, so a shape with an unknown dim is not set.
bool InferOutput(OrtShapeInferContext* ctx, size_t index, ONNXTensorElementDataType type, const InferShape& shape) {
  const bool complete = !shape.empty() && std::all_of(shape.begin(), shape.end(), [](const InferDim& dim) {
    return dim.value >= 0 || !dim.symbol.empty();
  });
  if (!complete) return true;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (!Ok(Api().CreateTensorTypeAndShapeInfo(&info))) return false;
  std::vector<int64_t> values;
  std::vector<const char*> symbols;
  for (const InferDim& dim : shape) {
    values.push_back(dim.value);
    symbols.push_back(dim.symbol.c_str());
  }
  bool ok = Ok(Api().SetTensorElementType(info, type)) && Ok(Api().SetDimensions(info, values.data(), values.size())) &&
            Ok(Api().SetSymbolicDimensions(info, symbols.data(), symbols.size())) &&
            Ok(Api().ShapeInferContext_SetOutputTypeShape(ctx, index, info));
  Api().ReleaseTensorTypeAndShapeInfo(info);
  return ok;
}

InferDim Known(int64_t value) { return InferDim{value, ""}; }

struct InferredDims {
  ONNXTensorElementDataType type;
  InferDim seq_length, batch_size, hidden_size, num_directions;
  int64_t layout;
};

// Dims from X and the attributes; false when X's rank is unknown.
bool InferDims(OrtShapeInferContext* ctx, InferredDims* dims) {
  InferShape x_shape;
  if (!InferInput(ctx, 0, &dims->type, &x_shape) || x_shape.size() != 3) return false;
  dims->layout = InferAttrInt(ctx, schema::attr::kLayout).value_or(0);
  dims->seq_length = dims->layout == 1 ? x_shape[1] : x_shape[0];
  dims->batch_size = dims->layout == 1 ? x_shape[0] : x_shape[1];
  const auto hidden = InferAttrInt(ctx, schema::attr::kHiddenSize);
  dims->hidden_size = Known(hidden && *hidden > 0 ? *hidden : -1);
  const auto direction = InferAttrString(ctx, schema::attr::kDirection);
  dims->num_directions = Known(direction && *direction == "bidirectional" ? 2 : 1);
  return true;
}

// factor*dim, unknown when dim is or when the product would not fit (hidden_size comes straight
// from the node here, before the kernel has checked its range).
InferDim Times(int64_t factor, const InferDim& dim) {
  int64_t product = -1;
  if (dim.value < 0 || __builtin_mul_overflow(factor, dim.value, &product)) return Known(-1);
  return Known(product);
}

InferShape SequenceShapeOf(const InferredDims& d, const InferDim& width) {
  if (d.layout == 1) return {d.batch_size, d.seq_length, d.num_directions, width};
  return {d.seq_length, d.num_directions, d.batch_size, width};
}

InferShape StateShapeOf(const InferredDims& d) {
  if (d.layout == 1) return {d.batch_size, d.num_directions, d.hidden_size};
  return {d.num_directions, d.batch_size, d.hidden_size};
}

OrtStatus* InferTrainingShapes(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  InferredDims d{};
  if (!InferDims(ctx, &d)) return nullptr;
  using Out = schema::lstm_training::Out;
  const std::array<std::pair<Out, InferShape>, 5> outputs = {{
      {Out::kHAll, SequenceShapeOf(d, d.hidden_size)},
      {Out::kHt, StateShapeOf(d)},
      {Out::kCt, StateShapeOf(d)},
      {Out::kCAll, SequenceShapeOf(d, d.hidden_size)},
      {Out::kIOFC, SequenceShapeOf(d, Times(4, d.hidden_size))},
  }};
  for (const auto& [port, shape] : outputs) {
    if (!InferOutput(ctx, schema::lstm_training::Index(port), d.type, shape)) break;
  }
  return nullptr;
}

OrtStatus* InferGradShapes(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  InferredDims d{};
  if (!InferDims(ctx, &d)) return nullptr;
  using In = schema::lstm_grad::In;
  using Out = schema::lstm_grad::Out;
  // dX, dW, dR take the shapes of X, W, R.
  auto input_shape = [&](In port) {
    InferShape shape;
    ONNXTensorElementDataType type;
    if (!InferInput(ctx, schema::lstm_grad::Index(port), &type, &shape) || shape.size() != 3) shape.clear();
    return shape;
  };
  const std::array<std::pair<Out, InferShape>, 7> outputs = {{
      {Out::kDX, input_shape(In::kX)},
      {Out::kDW, input_shape(In::kW)},
      {Out::kDR, input_shape(In::kR)},
      {Out::kDB, {d.num_directions, Times(8, d.hidden_size)}},
      {Out::kDH0, StateShapeOf(d)},
      {Out::kDC0, StateShapeOf(d)},
      {Out::kDP, {d.num_directions, Times(3, d.hidden_size)}},
  }};
  for (const auto& [port, shape] : outputs) {
    if (!InferOutput(ctx, schema::lstm_grad::Index(port), d.type, shape)) break;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Kernels.

template <typename T>
class LstmTrainingKernel {
 public:
  LstmTrainingKernel(const LstmConfig& config, std::string node) : config_(config), node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    namespace spec = schema::lstm_training;
    using In = spec::In;
    using Out = spec::Out;
    try {
      TrainingInputs inputs;
      std::string error = ReadInputs(context, &inputs, spec::kInputOptional, spec::kInputNames);
      LstmDims dims;
      if (error.empty()) error = ValidateTrainingInputs(config_, inputs, &dims);
      if (!error.empty()) return Fail(spec::kName, node_, error);
      auto in = [&](In port) { return inputs[spec::Index(port)].template Data<T>(); };

      std::array<void*, spec::kNumOutputs> out{};
      const std::array<std::pair<Out, std::vector<int64_t>>, spec::kNumOutputs> shapes = {{
          {Out::kHAll, SequenceShape(dims, dims.hidden_size)},
          {Out::kHt, StateShape(dims)},
          {Out::kCt, StateShape(dims)},
          {Out::kCAll, SequenceShape(dims, dims.hidden_size)},
          {Out::kIOFC, SequenceShape(dims, dims.GateWidth())},
      }};
      for (const auto& [port, shape] : shapes) {
        error = AllocateOutput(context, spec::Index(port), shape, &out[spec::Index(port)]);
        if (!error.empty()) return Fail(spec::kName, node_, spec::kOutputNames[spec::Index(port)] + (": " + error));
      }
      LstmForwardTensors<T> t;
      t.X = in(In::kX);
      t.W = in(In::kW);
      t.R = in(In::kR);
      t.B = in(In::kB);
      t.sequence_lens = inputs[spec::Index(In::kSequenceLens)].template Data<int32_t>();
      t.initial_h = in(In::kInitialH);
      t.initial_c = in(In::kInitialC);
      t.P = in(In::kP);
      t.HAll = static_cast<T*>(out[spec::Index(Out::kHAll)]);
      t.Ht = static_cast<T*>(out[spec::Index(Out::kHt)]);
      t.Ct = static_cast<T*>(out[spec::Index(Out::kCt)]);
      t.CAll = static_cast<T*>(out[spec::Index(Out::kCAll)]);
      t.IOFC = static_cast<T*>(out[spec::Index(Out::kIOFC)]);
      LstmForward<T>(dims, config_, t, OrtExecutor(context), OrtScratchAllocator(context));
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
class LstmGradKernel {
 public:
  LstmGradKernel(const LstmConfig& config, std::string node) : config_(config), node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    namespace spec = schema::lstm_grad;
    using In = spec::In;
    using Out = spec::Out;
    try {
      GradInputs inputs;
      std::string error = ReadInputs(context, &inputs, spec::kInputOptional, spec::kInputNames);
      LstmDims dims;
      if (error.empty()) error = ValidateGradInputs(config_, inputs, &dims);
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
          {Out::kDC0, StateShape(dims)},
          {Out::kDP, {dims.num_directions, 3 * dims.hidden_size}},
      }};
      for (const auto& [port, shape] : shapes) {
        error = AllocateOutput(context, spec::Index(port), shape, &out[spec::Index(port)]);
        if (!error.empty()) return Fail(spec::kName, node_, spec::kOutputNames[spec::Index(port)] + (": " + error));
      }
      LstmBackwardTensors<T> t;
      t.X = in(In::kX);
      t.W = in(In::kW);
      t.R = in(In::kR);
      t.sequence_lens = inputs[spec::Index(In::kSequenceLens)].template Data<int32_t>();
      t.initial_h = in(In::kInitialH);
      t.initial_c = in(In::kInitialC);
      t.HAll = in(In::kHAll);
      t.CAll = in(In::kCAll);
      t.IOFC = in(In::kIOFC);
      t.grad_HAll = in(In::kGradHAll);
      t.grad_Ht = in(In::kGradHt);
      t.grad_Ct = in(In::kGradCt);
      t.P = in(In::kP);
      t.dX = static_cast<T*>(out[spec::Index(Out::kDX)]);
      t.dW = static_cast<T*>(out[spec::Index(Out::kDW)]);
      t.dR = static_cast<T*>(out[spec::Index(Out::kDR)]);
      t.dB = static_cast<T*>(out[spec::Index(Out::kDB)]);
      t.dH0 = static_cast<T*>(out[spec::Index(Out::kDH0)]);
      t.dC0 = static_cast<T*>(out[spec::Index(Out::kDC0)]);
      t.dP = static_cast<T*>(out[spec::Index(Out::kDP)]);
      LstmBackward<T>(dims, config_, t, OrtExecutor(context), OrtScratchAllocator(context));
      return nullptr;
    } catch (const std::bad_alloc&) {
      return OutOfMemory(spec::kName, node_);
    }
  }

 private:
  LstmConfig config_;
  std::string node_;
};

// ---------------------------------------------------------------------------------------------
// Op definitions: one per (op, element type). `Spec` is a generated schema namespace wrapper.

struct TrainingSpec {
  static constexpr const char* kName = schema::lstm_training::kName;
  static constexpr int kNumInputs = schema::lstm_training::kNumInputs;
  static constexpr int kNumOutputs = schema::lstm_training::kNumOutputs;
  static constexpr const bool* kInputOptional = schema::lstm_training::kInputOptional;
  static constexpr const bool* kInputIsInt32 = schema::lstm_training::kInputIsInt32;
  static constexpr const bool* kOutputOptional = schema::lstm_training::kOutputOptional;
  static constexpr auto kInfer = &InferTrainingShapes;
  template <typename T>
  using Kernel = LstmTrainingKernel<T>;
};

struct GradSpec {
  static constexpr const char* kName = schema::lstm_grad::kName;
  static constexpr int kNumInputs = schema::lstm_grad::kNumInputs;
  static constexpr int kNumOutputs = schema::lstm_grad::kNumOutputs;
  static constexpr const bool* kInputOptional = schema::lstm_grad::kInputOptional;
  static constexpr const bool* kInputIsInt32 = schema::lstm_grad::kInputIsInt32;
  static constexpr const bool* kOutputOptional = schema::lstm_grad::kOutputOptional;
  static constexpr auto kInfer = &InferGradShapes;
  template <typename T>
  using Kernel = LstmGradKernel<T>;
};

template <typename Spec, typename T>
struct LstmOp : Ort::CustomOpBase<LstmOp<Spec, T>, typename Spec::template Kernel<T>, /*WithStatus=*/true> {
  using KernelType = typename Spec::template Kernel<T>;

  LstmOp() {
    // ORT 1.19 rejects ops that declare a newer struct version than it knows.
    OrtCustomOp::version = kOrtApiVersion;
  }

  // Before onnxruntime 1.25, ORT's shape-inference context dereferences the type of an omitted
  // optional input (an empty name in the middle of the input list) and crashes, so the hook is
  // installed only where that is fixed.
  void EnableShapeInference(bool enable) { OrtCustomOp::InferOutputShapeFn = enable ? Spec::kInfer : nullptr; }

  OrtStatus* CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    const std::string node = NodeName(info);
    RawLstmAttributes raw;
    std::string error = ReadLstmAttributes(info, &raw);
    LstmConfig config;
    if (error.empty()) error = ParseLstmConfig(raw, &config);
    if (error.empty() && std::string(Spec::kName) == schema::lstm_grad::kName) {
      error = CheckGradientActivations(config);
    }
    if (!error.empty()) return Fail(Spec::kName, node, error);
    try {
      *kernel = new KernelType(config, node);
    } catch (const std::bad_alloc&) {
      return MakeStatus(ORT_FAIL, std::string(Spec::kName) + ": out of memory");
    }
    return nullptr;
  }

  // LSTMGrad derives gate derivatives from the activated gates, which needs activations whose
  // output determines the derivative.
  static std::string CheckGradientActivations(const LstmConfig& config) {
    for (int64_t d = 0; d < config.num_directions; ++d) {
      for (const Activation* act : {&config.activations[d].f, &config.activations[d].g}) {
        if (!DerivativeDeterminedByOutput(*act)) {
          return std::string("attribute activation_alpha: ") + ActivationName(act->kind) + " with alpha=" +
                 std::to_string(act->alpha) +
                 " maps negative and positive inputs onto the same outputs, so LSTMGrad cannot recover its "
                 "derivative from the stashed gates; use alpha >= 0";
        }
      }
    }
    return "";
  }

  const char* GetName() const { return Spec::kName; }
  size_t GetInputTypeCount() const { return static_cast<size_t>(Spec::kNumInputs); }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return Spec::kInputIsInt32[index] ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : kElementType<T>;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return Spec::kInputOptional[index] ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return static_cast<size_t>(Spec::kNumOutputs); }
  ONNXTensorElementDataType GetOutputType(size_t) const { return kElementType<T>; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t index) const {
    return Spec::kOutputOptional[index] ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
};

// Static storage: ORT keeps pointers to the op definitions for the life of every session.
LstmOp<TrainingSpec, float> g_training_float;
LstmOp<TrainingSpec, double> g_training_double;
LstmOp<GradSpec, float> g_grad_float;
LstmOp<GradSpec, double> g_grad_double;

}  // namespace

std::string AddLstmOps(OrtCustomOpDomain* domain) {
  const bool shape_inference = RuntimeIsAtLeast(kOrtApiVersionFixedShapeInference);
  g_training_float.EnableShapeInference(shape_inference);
  g_training_double.EnableShapeInference(shape_inference);
  g_grad_float.EnableShapeInference(shape_inference);
  g_grad_double.EnableShapeInference(shape_inference);
  return AddOps(domain, {&g_training_float, &g_training_double, &g_grad_float, &g_grad_double});
}

}  // namespace ortlstm::ort
