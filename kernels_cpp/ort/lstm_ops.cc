// LSTMTraining and LSTMGrad as ORT custom ops. Port counts, order and optionality come from the
// generated schema (generated/op_schema.h); the kernel and op definition are the recurrent ops'
// shared ones (ort/recurrent_kernel.h); this file holds the LSTM's static shape inference and its
// Specs, which adapt ORT tensors to lstm/ math.
#include "ort/lstm_ops.h"

#include <algorithm>
#include <array>
#include <new>
#include <string>
#include <vector>

#include "generated/op_schema.h"
#include "lstm/lstm_math.h"
#include "ort/lstm_validation.h"
#include "ort/recurrent_kernel.h"

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
  InferDim seq_length, batch_size, input_size, hidden_size, num_directions;
  int64_t layout;
};

// Dims from X and the attributes; false when X's rank is unknown.
bool InferDims(OrtShapeInferContext* ctx, InferredDims* dims) {
  InferShape x_shape;
  if (!InferInput(ctx, 0, &dims->type, &x_shape) || x_shape.size() != 3) return false;
  dims->layout = InferAttrInt(ctx, schema::attr::kLayout).value_or(0);
  dims->seq_length = dims->layout == 1 ? x_shape[1] : x_shape[0];
  dims->batch_size = dims->layout == 1 ? x_shape[0] : x_shape[1];
  dims->input_size = x_shape[2];
  const auto hidden = InferAttrInt(ctx, schema::attr::kHiddenSize);
  dims->hidden_size = Known(hidden && *hidden > 0 ? *hidden : -1);
  const auto direction = InferAttrString(ctx, schema::attr::kDirection);
  const int64_t num_directions = schema::attr::NumDirections(direction ? direction->c_str() : "");
  dims->num_directions = Known(num_directions > 0 ? num_directions : 1);
  return true;
}

// factor*dim, unknown when dim is or when the product would not fit (hidden_size comes straight
// from the node here, before the kernel has checked its range).
InferDim Times(int64_t factor, const InferDim& dim) {
  int64_t product = -1;
  if (dim.value < 0 || __builtin_mul_overflow(factor, dim.value, &product)) return Known(-1);
  return Known(product);
}

// factor times one of the spec's dims; a symbolic dim stays a symbol only with factor 1.
InferDim InferDimOf(const InferredDims& d, schema::Dim dim, int64_t factor) {
  InferDim value = Known(-1);
  switch (dim) {
    case schema::Dim::kSeqLength: value = d.seq_length; break;
    case schema::Dim::kBatchSize: value = d.batch_size; break;
    case schema::Dim::kInputSize: value = d.input_size; break;
    case schema::Dim::kHiddenSize: value = d.hidden_size; break;
    case schema::Dim::kNumDirections: value = d.num_directions; break;
  }
  return factor == 1 ? value : Times(factor, value);
}

// Sets every output's type and shape from the op's generated OutputShape (the spec's shapes), except
// where `from_input` gives a port the shape of an input instead.
template <typename Spec, typename FromInput>
void InferOutputs(OrtShapeInferContext* ctx, const InferredDims& d, const FromInput& from_input) {
  const auto dim_of = [&](schema::Dim dim, int64_t factor) { return InferDimOf(d, dim, factor); };
  for (int port = 0; port < Spec::kNumOutputs; ++port) {
    const auto out = static_cast<typename Spec::Out>(port);
    InferShape shape;
    if (!from_input(out, &shape)) shape = Spec::template OutputShape<InferShape>(out, d.layout, dim_of);
    if (!InferOutput(ctx, Spec::Index(out), d.type, shape)) break;
  }
}

OrtStatus* InferTrainingShapes(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  InferredDims d{};
  if (!InferDims(ctx, &d)) return nullptr;
  InferOutputs<schema::lstm_training::Traits>(ctx, d, [](schema::lstm_training::Out, InferShape*) { return false; });
  return nullptr;
}

OrtStatus* InferGradShapes(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  InferredDims d{};
  if (!InferDims(ctx, &d)) return nullptr;
  using In = schema::lstm_grad::In;
  using Out = schema::lstm_grad::Out;
  // dX, dW, dR take the shapes of X, W, R (their symbols too).
  InferOutputs<schema::lstm_grad::Traits>(ctx, d, [&](Out port, InferShape* shape) {
    const In source = port == Out::kDX ? In::kX : port == Out::kDW ? In::kW : port == Out::kDR ? In::kR : In::kCount;
    if (source == In::kCount) return false;
    ONNXTensorElementDataType type;
    if (!InferInput(ctx, schema::lstm_grad::Index(source), &type, shape) || shape->size() != 3) shape->clear();
    return true;
  });
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// The two ops' Specs for the shared kernel and op definition (ort/recurrent_kernel.h): their
// attributes, input checks, output shapes and the math they call.

std::string ReadLstmConfig(const OrtKernelInfo* info, bool gradient, LstmConfig* config) {
  RawLstmAttributes raw;
  std::string error = ReadLstmAttributes(info, &raw);
  if (error.empty()) error = ParseLstmConfig(raw, config);
  if (error.empty() && gradient) error = CheckGradientActivations(*config, schema::lstm_grad::kName);
  return error;
}

struct TrainingSpec : schema::lstm_training::Traits {
  using Config = LstmConfig;
  static constexpr auto kInfer = &InferTrainingShapes;
  static std::string ReadConfig(const OrtKernelInfo* info, Config* config) {
    return ReadLstmConfig(info, false, config);
  }
  static std::string Validate(const Config& config, const TrainingInputs& inputs, LstmDims* dims) {
    return ValidateTrainingInputs(config, inputs, dims);
  }
  template <typename T>
  static void Run(const LstmDims& dims, const Config& config, const RecurrentPorts<TrainingSpec>& ports,
                  const Executor& executor, const ScratchAllocator& allocator) {
    LstmForwardTensors<T> t;
    BindTrainingPorts<T>(ports, &t);
    t.initial_c = ports.In<T>(In::kInitialC);
    t.P = ports.In<T>(In::kP);
    t.Ct = ports.Out<T>(Out::kCt);
    t.CAll = ports.Out<T>(Out::kCAll);
    t.IOFC = ports.Out<T>(Out::kIOFC);
    LstmForward<T>(dims, config, t, executor, allocator);
  }
};

struct GradSpec : schema::lstm_grad::Traits {
  using Config = LstmConfig;
  static constexpr auto kInfer = &InferGradShapes;
  static std::string ReadConfig(const OrtKernelInfo* info, Config* config) {
    return ReadLstmConfig(info, true, config);
  }
  static std::string Validate(const Config& config, const GradInputs& inputs, LstmDims* dims) {
    return ValidateGradInputs(config, inputs, dims);
  }
  template <typename T>
  static void Run(const LstmDims& dims, const Config& config, const RecurrentPorts<GradSpec>& ports,
                  const Executor& executor, const ScratchAllocator& allocator) {
    LstmBackwardTensors<T> t;
    BindGradPorts<T>(ports, &t);
    t.initial_c = ports.In<T>(In::kInitialC);
    t.CAll = ports.In<T>(In::kCAll);
    t.IOFC = ports.In<T>(In::kIOFC);
    t.grad_Ct = ports.In<T>(In::kGradCt);
    t.P = ports.In<T>(In::kP);
    t.dC0 = ports.Out<T>(Out::kDC0);
    t.dP = ports.Out<T>(Out::kDP);
    LstmBackward<T>(dims, config, t, executor, allocator);
  }
};

}  // namespace

std::string AddLstmOps(OrtCustomOpDomain* domain) {
  return RecurrentOps<TrainingSpec, GradSpec>::Add(domain, RuntimeIsAtLeast(kOrtApiVersionFixedShapeInference));
}

}  // namespace ortlstm::ort
