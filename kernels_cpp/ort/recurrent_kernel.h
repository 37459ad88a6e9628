// The ORT kernel and op definition of every recurrent training and gradient op (LSTMTraining,
// LSTMGrad, GRUTraining, GRUGrad, RNNTraining, RNNGrad): what they share is reading the ports of
// the op's generated schema, validating them once, allocating the outputs, turning bad_alloc into
// a status and answering ORT's port queries; what a cell adds is its Spec (lstm_ops.cc,
// gru_ops.cc, rnn_ops.cc):
//   ORTLSTM_SCHEMA_TRAITS(schema::op)      the generated schema's names, ports and optionality
//   using Config;                          the parsed attributes (LstmConfig, GruConfig; the RNN's LstmConfig)
//   static std::string ReadConfig(const OrtKernelInfo*, Config*);  read, parse and check them
//   static constexpr OrtStatus* (*kInfer)(const OrtCustomOp*, OrtShapeInferContext*);  or nullptr
//   static std::string Validate(const Config&, const std::array<TensorArg, kNumInputs>&, LstmDims*);
//   static std::array<std::vector<int64_t>, kNumOutputs> OutputShapes(const LstmDims&);  port order
//   template <typename T> static void Run(const LstmDims&, const Config&, const RecurrentPorts<Spec>&,
//                                         const Executor&, const ScratchAllocator&);
#pragma once

#include <array>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "lstm/lstm_dims.h"
#include "ort/lstm_validation.h"
#include "ort/ort_util.h"
#include "ort/schema_op.h"

// The constants of one op's generated schema namespace (generated/op_schema.h), as members of
// the Spec struct a template can take (a namespace cannot be a template argument).
#define ORTLSTM_SCHEMA_TRAITS(ns)                                                                  \
  static constexpr const char* kName = ns::kName;                                                  \
  using In = ns::In;                                                                               \
  using Out = ns::Out;                                                                             \
  static constexpr int kNumInputs = ns::kNumInputs;                                                \
  static constexpr int kNumOutputs = ns::kNumOutputs;                                              \
  static constexpr const auto& kInputNames = ns::kInputNames;                                      \
  static constexpr const auto& kOutputNames = ns::kOutputNames;                                    \
  static constexpr const auto& kInputOptional = ns::kInputOptional;                                \
  static constexpr const auto& kInputIsInt32 = ns::kInputIsInt32;                                  \
  static constexpr const auto& kOutputOptional = ns::kOutputOptional;                              \
  static constexpr std::size_t Index(In port) { return ns::Index(port); }                          \
  static constexpr std::size_t Index(Out port) { return ns::Index(port); }

namespace ortlstm::ort {

// The ports of one call: the read inputs and the allocated outputs (nullptr where not requested).
template <typename Spec>
struct RecurrentPorts {
  const std::array<TensorArg, Spec::kNumInputs>& inputs;
  const std::array<void*, Spec::kNumOutputs>& outputs;

  template <typename T>
  const T* In(typename Spec::In port) const {
    return inputs[Spec::Index(port)].template Data<T>();
  }
  template <typename T>
  T* Out(typename Spec::Out port) const {
    return static_cast<T*>(outputs[Spec::Index(port)]);
  }
};

// The ports every recurrent training op has (its Spec's In/Out name them alike), bound to the
// cell's forward tensors (LstmForwardTensors, GruForwardTensors); the cell binds the rest.
template <typename T, typename Spec, typename Tensors>
void BindTrainingPorts(const RecurrentPorts<Spec>& ports, Tensors* t) {
  using In = typename Spec::In;
  using Out = typename Spec::Out;
  t->X = ports.template In<T>(In::kX);
  t->W = ports.template In<T>(In::kW);
  t->R = ports.template In<T>(In::kR);
  t->B = ports.template In<T>(In::kB);
  t->sequence_lens = ports.template In<int32_t>(In::kSequenceLens);
  t->initial_h = ports.template In<T>(In::kInitialH);
  t->HAll = ports.template Out<T>(Out::kHAll);
  t->Ht = ports.template Out<T>(Out::kHt);
}

// The same for the ports every recurrent gradient op has (LstmBackwardTensors, GruBackwardTensors).
template <typename T, typename Spec, typename Tensors>
void BindGradPorts(const RecurrentPorts<Spec>& ports, Tensors* t) {
  using In = typename Spec::In;
  using Out = typename Spec::Out;
  t->X = ports.template In<T>(In::kX);
  t->W = ports.template In<T>(In::kW);
  t->R = ports.template In<T>(In::kR);
  t->sequence_lens = ports.template In<int32_t>(In::kSequenceLens);
  t->initial_h = ports.template In<T>(In::kInitialH);
  t->HAll = ports.template In<T>(In::kHAll);
  t->grad_HAll = ports.template In<T>(In::kGradHAll);
  t->grad_Ht = ports.template In<T>(In::kGradHt);
  t->dX = ports.template Out<T>(Out::kDX);
  t->dW = ports.template Out<T>(Out::kDW);
  t->dR = ports.template Out<T>(Out::kDR);
  t->dB = ports.template Out<T>(Out::kDB);
  t->dH0 = ports.template Out<T>(Out::kDH0);
}

// The output shapes of the gradient op of a cell whose one state is H (GRUGrad, RNNGrad), in port
// order: dX, dW, dR, dB, dH0.
inline std::array<std::vector<int64_t>, 5> HiddenStateGradShapes(const LstmDims& dims) {
  const auto weights = WeightShapes(dims);
  return {InputShape(dims), weights[0], weights[1], weights[2], StateShape(dims)};
}

template <typename Spec, typename T>
class RecurrentKernel {
 public:
  RecurrentKernel(const typename Spec::Config& config, std::string node) : config_(config), node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    try {
      std::array<TensorArg, Spec::kNumInputs> inputs;
      std::string error = ReadInputs(context, &inputs, Spec::kInputOptional, Spec::kInputNames);
      LstmDims dims;
      if (error.empty()) error = Spec::Validate(config_, inputs, &dims);
      if (!error.empty()) return Fail(Spec::kName, node_, error);
      const std::array<std::vector<int64_t>, Spec::kNumOutputs> shapes = Spec::OutputShapes(dims);
      std::array<void*, Spec::kNumOutputs> out{};
      for (size_t port = 0; port < shapes.size(); ++port) {
        error = AllocateOutput(context, port, shapes[port], &out[port]);
        if (!error.empty()) return Fail(Spec::kName, node_, Spec::kOutputNames[port] + (": " + error));
      }
      Spec::template Run<T>(dims, config_, RecurrentPorts<Spec>{inputs, out}, OrtExecutor(context),
                            OrtScratchAllocator(context));
      return nullptr;
    } catch (const std::bad_alloc&) {
      return OutOfMemory(Spec::kName, node_);
    }
  }

 private:
  typename Spec::Config config_;
  std::string node_;
};

// The op definition of one (op, element type): the schema's ports, the config read once per node.
template <typename Spec, typename T>
struct RecurrentOp : SchemaOp<RecurrentOp<Spec, T>, RecurrentKernel<Spec, T>, Spec, T> {
  // Before onnxruntime 1.25, ORT's shape-inference context dereferences the type of an omitted
  // optional input (an empty name in the middle of the input list) and crashes, so the hook is
  // installed only where that is fixed.
  void EnableShapeInference(bool enable) { OrtCustomOp::InferOutputShapeFn = enable ? Spec::kInfer : nullptr; }

  OrtStatus* CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    const std::string node = NodeName(info);
    typename Spec::Config config;
    std::string error = Spec::ReadConfig(info, &config);
    if (error.empty()) error = RefuseBf16Tensors<T>(MatmulPrecisionOf(config));
    if (!error.empty()) return Fail(Spec::kName, node, error);
    return RecurrentOp::NewKernel(kernel, config, node);
  }

  ONNXTensorElementDataType GetInputType(size_t index) const {
    return Spec::kInputIsInt32[index] ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : kElementType<T>;
  }
};

// The four op definitions of one cell (training and gradient op, float and double), in static
// storage: ORT keeps pointers to them for the life of every session.
template <typename TrainingSpec, typename GradSpec>
struct RecurrentOps {
  static std::string Add(OrtCustomOpDomain* domain, bool shape_inference) {
    static RecurrentOp<TrainingSpec, float> training_float;
    static RecurrentOp<TrainingSpec, double> training_double;
    static RecurrentOp<GradSpec, float> grad_float;
    static RecurrentOp<GradSpec, double> grad_double;
    training_float.EnableShapeInference(shape_inference);
    training_double.EnableShapeInference(shape_inference);
    grad_float.EnableShapeInference(shape_inference);
    grad_double.EnableShapeInference(shape_inference);
    return AddOps(domain, {&training_float, &training_double, &grad_float, &grad_double});
  }
};

}  // namespace ortlstm::ort
