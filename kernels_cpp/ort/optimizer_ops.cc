// AdamUpdate as an ORT custom op. Port order and optionality come from the generated schema.
#include "ort/optimizer_ops.h"

#include <array>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/checked_math.h"
#include "generated/op_schema.h"
#include "optim/adam.h"

namespace ortlstm::ort {
namespace {

namespace spec = schema::adam_update;
using In = spec::In;
using Out = spec::Out;

const char* InputName(In port) { return spec::kInputNames[spec::Index(port)]; }
const char* OutputName(Out port) { return spec::kOutputNames[spec::Index(port)]; }

// Whether output `port` is wired in the node (ORT gives no query: an omitted optional output is an
// empty name, whose count ORT reports, so an index past the node's outputs is absent too).
bool OutputWired(OrtKernelContext* context, Out port) {
  size_t count = 0;
  if (OrtStatus* status = Api().KernelContext_GetOutputCount(context, &count)) {
    Api().ReleaseStatus(status);
    return false;
  }
  return spec::Index(port) < count;
}

// The value of a 0-D or one-element float64 input; "" or a message naming it.
std::string ReadScalar(const std::array<TensorArg, spec::kNumInputs>& inputs, In port, double* value) {
  const TensorArg& arg = inputs[spec::Index(port)];
  if (arg.shape.size() > 1 || CheckedProduct(arg.shape) != 1) {
    return std::string("input ") + InputName(port) + ": expected a scalar (shape [] or [1]), got shape " +
           FormatShape(arg.shape);
  }
  *value = *arg.template Data<double>();
  return "";
}

template <typename T>
class AdamUpdateKernel {
 public:
  AdamUpdateKernel(bool decoupled_weight_decay, bool maximize, std::string node)
      : decoupled_weight_decay_(decoupled_weight_decay), maximize_(maximize), node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    try {
      std::array<TensorArg, spec::kNumInputs> inputs;
      std::string error = ReadInputs(context, &inputs, spec::kInputOptional, spec::kInputNames);
      if (error.empty()) error = Check(context, inputs);
      if (!error.empty()) return Fail(spec::kName, node_, error);
      auto in = [&](In port) { return inputs[spec::Index(port)].template Data<T>(); };

      AdamHyperparameters h;
      for (const auto& [port, value] : std::array<std::pair<In, double*>, 5>{{
               {In::kLr, &h.lr},
               {In::kStep, &h.step},
               {In::kBeta1, &h.beta1},
               {In::kBeta2, &h.beta2},
               {In::kEps, &h.eps},
           }}) {
        error = ReadScalar(inputs, port, value);
        if (!error.empty()) return Fail(spec::kName, node_, error);
      }
      if (inputs[spec::Index(In::kWeightDecay)].present) {
        error = ReadScalar(inputs, In::kWeightDecay, &h.weight_decay);
        if (!error.empty()) return Fail(spec::kName, node_, error);
      }
      h.decoupled_weight_decay = decoupled_weight_decay_;
      h.maximize = maximize_;
      const AdamScalars<T> s = AdamScalarsFor<T>(h);

      const std::vector<int64_t>& shape = inputs[spec::Index(In::kParam)].shape;
      AdamTensors<T> t;
      // ORT holds the tensor, so its element count fits; checked all the same.
      const std::optional<int64_t> count = CheckedProduct(shape);
      if (!count) return Fail(spec::kName, node_, "input param: shape " + FormatShape(shape) + " overflows");
      t.count = *count;
      t.param = in(In::kParam);
      t.grad = in(In::kGrad);
      t.exp_avg = in(In::kExpAvg);
      t.exp_avg_sq = in(In::kExpAvgSq);
      t.max_exp_avg_sq = in(In::kMaxExpAvgSq);
      std::array<void*, spec::kNumOutputs> out{};
      for (Out port : {Out::kParamOut, Out::kExpAvgOut, Out::kExpAvgSqOut, Out::kMaxExpAvgSqOut}) {
        if (port == Out::kMaxExpAvgSqOut && t.max_exp_avg_sq == nullptr) continue;
        error = AllocateOutput(context, spec::Index(port), shape, &out[spec::Index(port)]);
        if (!error.empty()) return Fail(spec::kName, node_, std::string(OutputName(port)) + ": " + error);
      }
      t.param_out = static_cast<T*>(out[spec::Index(Out::kParamOut)]);
      t.exp_avg_out = static_cast<T*>(out[spec::Index(Out::kExpAvgOut)]);
      t.exp_avg_sq_out = static_cast<T*>(out[spec::Index(Out::kExpAvgSqOut)]);
      t.max_exp_avg_sq_out = static_cast<T*>(out[spec::Index(Out::kMaxExpAvgSqOut)]);
      AdamUpdate<T>(s, t, OrtExecutor(context));
      return nullptr;
    } catch (const std::bad_alloc&) {
      return OutOfMemory(spec::kName, node_);
    }
  }

 private:
  // Shapes and the optional ports' pairing; "" or a message naming the input.
  std::string Check(OrtKernelContext* context, const std::array<TensorArg, spec::kNumInputs>& inputs) const {
    const std::vector<int64_t>& shape = inputs[spec::Index(In::kParam)].shape;
    for (In port : {In::kGrad, In::kExpAvg, In::kExpAvgSq, In::kMaxExpAvgSq}) {
      const TensorArg& arg = inputs[spec::Index(port)];
      if (arg.present && arg.shape != shape) {
        return std::string("input ") + InputName(port) + ": expected shape " + FormatShape(shape) +
               " (param's), got " + FormatShape(arg.shape);
      }
    }
    const bool amsgrad_in = inputs[spec::Index(In::kMaxExpAvgSq)].present;
    const bool amsgrad_out = OutputWired(context, Out::kMaxExpAvgSqOut);
    if (amsgrad_in != amsgrad_out) {
      return std::string("input ") + InputName(In::kMaxExpAvgSq) + " and output " +
             OutputName(Out::kMaxExpAvgSqOut) + " go together (amsgrad): the node has " +
             (amsgrad_in ? "the input without the output" : "the output without the input");
    }
    return "";
  }

  bool decoupled_weight_decay_;
  bool maximize_;
  std::string node_;
};

template <typename T>
struct AdamUpdateOp : Ort::CustomOpBase<AdamUpdateOp<T>, AdamUpdateKernel<T>, /*WithStatus=*/true> {
  AdamUpdateOp() {
    // ORT 1.19 rejects ops that declare a newer struct version than it knows.
    OrtCustomOp::version = kOrtApiVersion;
  }

  OrtStatus* CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    const std::string node = NodeName(info);
    int64_t decoupled = spec::kAttrDecoupledWeightDecayDefault;
    int64_t maximize = spec::kAttrMaximizeDefault;
    std::string error;
    for (const auto& [name, fallback, value] : std::array<std::tuple<const char*, int64_t, int64_t*>, 2>{{
             {spec::kAttrDecoupledWeightDecay, spec::kAttrDecoupledWeightDecayDefault, &decoupled},
             {spec::kAttrMaximize, spec::kAttrMaximizeDefault, &maximize},
         }}) {
      error = ReadIntAttribute(info, name, fallback, value);
      if (error.empty() && *value != 0 && *value != 1) {
        error = std::string("attribute ") + name + ": expected 0 or 1, got " + std::to_string(*value);
      }
      if (!error.empty()) return Fail(spec::kName, node, error);
    }
    try {
      *kernel = new AdamUpdateKernel<T>(decoupled == 1, maximize == 1, node);
    } catch (const std::bad_alloc&) {
      return MakeStatus(ORT_FAIL, std::string(spec::kName) + ": out of memory");
    }
    return nullptr;
  }

  const char* GetName() const { return spec::kName; }
  size_t GetInputTypeCount() const { return static_cast<size_t>(spec::kNumInputs); }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return spec::kInputIsDouble[index] ? ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE : kElementType<T>;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return spec::kInputOptional[index] ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return static_cast<size_t>(spec::kNumOutputs); }
  ONNXTensorElementDataType GetOutputType(size_t) const { return kElementType<T>; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t index) const {
    return spec::kOutputOptional[index] ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
};

// Static storage: ORT keeps pointers to the op definitions for the life of every session.
AdamUpdateOp<float> g_adam_float;
AdamUpdateOp<double> g_adam_double;

}  // namespace

std::string AddOptimizerOps(OrtCustomOpDomain* domain) {
  for (OrtCustomOp* op : std::initializer_list<OrtCustomOp*>{&g_adam_float, &g_adam_double}) {
    if (OrtStatus* status = Api().CustomOpDomain_Add(domain, op)) {
      std::string message = Api().GetErrorMessage(status);
      Api().ReleaseStatus(status);
      return message;
    }
  }
  return "";
}

}  // namespace ortlstm::ort
