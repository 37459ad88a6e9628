// The ORT kernel and op definition of every recurrent training and gradient op (LSTMTraining,
// LSTMGrad, GRUTraining, GRUGrad, RNNTraining, RNNGrad): what they share is reading the ports of
// the op's generated schema, validating them once, allocating the outputs, turning bad_alloc into
// a status and answering ORT's port queries (the output shapes are the schema's generated OutputShape
// over the validated dims); what a cell adds is its Spec (lstm_ops.cc, gru_ops.cc, rnn_ops.cc):
//   struct Spec : schema::op::Traits      the generated schema's names, ports, optionality and shapes
//   using Config;                          the parsed attributes (LstmConfig, GruConfig; the RNN's LstmConfig)
//   static std::string ReadConfig(const OrtKernelInfo*, Config*);  read, parse and check them
//   static constexpr OrtStatus* (*kInfer)(const OrtCustomOp*, OrtShapeInferContext*);  or nullptr
//   static std::string Validate(const Config&, const std::array<TensorArg, kNumInputs>&, LstmDims*);
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

// The value of one of the spec's dims in a validated call.
inline int64_t DimValue(const LstmDims& dims, schema::Dim dim) {
  switch (dim) {
    case schema::Dim::kSeqLength: return dims.seq_length;
    case schema::Dim::kBatchSize: return dims.batch_size;
    case schema::Dim::kInputSize: return dims.input_size;
    case schema::Dim::kHiddenSize: return dims.hidden_size;
    case schema::Dim::kNumDirections: return dims.num_directions;
  }
  return -1;
}

// Every output's shape, in port order: the op's generated OutputShape (the spec's shapes) over the dims.
template <typename Spec>
std::array<std::vector<int64_t>, Spec::kNumOutputs> RecurrentOutputShapes(const LstmDims& dims) {
  const auto dim_of = [&](schema::Dim dim, int64_t factor) { return factor * DimValue(dims, dim); };
  std::array<std::vector<int64_t>, Spec::kNumOutputs> shapes;
  for (size_t port = 0; port < shapes.size(); ++port) {
    shapes[port] = Spec::template OutputShape<std::vector<int64_t>>(static_cast<typename Spec::Out>(port),
                                                                    dims.layout, dim_of);
  }
  return shapes;
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
      const std::array<std::vector<int64_t>, Spec::kNumOutputs> shapes = RecurrentOutputShapes<Spec>(dims);
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
