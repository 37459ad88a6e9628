// AdamUpdate and SGDUpdate as ORT custom ops. Port order and optionality come from the generated
// schema; OptimizerOp below is what the two share (two 0/1 attributes, float64 hyperparameters).
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
#include "optim/sgd.h"
#include "ort/schema_op.h"

namespace ortlstm::ort {
namespace {

// Whether output `index` is wired in the node (ORT gives no query: an omitted optional output is an
// empty name, whose count ORT reports, so an index past the node's outputs is absent too).
bool OutputWired(OrtKernelContext* context, size_t index) {
  size_t count = 0;
  if (OrtStatus* status = Api().KernelContext_GetOutputCount(context, &count)) {
    Api().ReleaseStatus(status);
    return false;
  }
  return index < count;
}

// The value of a 0-D or one-element float64 input; "" or a message naming it.
std::string ReadScalar(const TensorArg& arg, const char* name, double* value) {
  if (arg.shape.size() > 1 || CheckedProduct(arg.shape) != 1) {
    return std::string("input ") + name + ": expected a scalar (shape [] or [1]), got shape " +
           FormatShape(arg.shape);
  }
  *value = *arg.template Data<double>();
  return "";
}

// "" or a message naming the first present input of `ports` whose shape is not `shape` (param's).
template <size_t N, typename Port>
std::string CheckSameShape(const std::array<TensorArg, N>& inputs, std::initializer_list<Port> ports,
                           const char* const* names, const std::vector<int64_t>& shape) {
  for (Port port : ports) {
    const TensorArg& arg = inputs[static_cast<size_t>(port)];
    if (arg.present && arg.shape != shape) {
      return std::string("input ") + names[static_cast<size_t>(port)] + ": expected shape " + FormatShape(shape) +
             " (param's), got " + FormatShape(arg.shape);
    }
  }
  return "";
}

// "" or why the state input `in` and output `out` (named) are not both present or both absent.
std::string CheckStatePair(bool in_present, bool out_wired, const char* in_name, const char* out_name,
                           const char* what) {
  if (in_present == out_wired) return "";
  return std::string("input ") + in_name + " and output " + out_name + " go together (" + what + "): the node has " +
         (in_present ? "the input without the output" : "the output without the input");
}

template <typename T>
class AdamUpdateKernel {
 public:
  AdamUpdateKernel(const std::array<int64_t, 2>& flags, std::string node)
      : decoupled_weight_decay_(flags[0] == 1), maximize_(flags[1] == 1), node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    namespace spec = schema::adam_update;
    using In = spec::In;
    using Out = spec::Out;
    try {
      std::array<TensorArg, spec::kNumInputs> inputs;
      auto arg = [&](In port) -> const TensorArg& { return inputs[spec::Index(port)]; };
      std::string error = ReadInputs(context, &inputs, spec::kInputOptional, spec::kInputNames);
      const std::vector<int64_t>& shape = arg(In::kParam).shape;
      if (error.empty()) {
        error = CheckSameShape(inputs, {In::kGrad, In::kExpAvg, In::kExpAvgSq, In::kMaxExpAvgSq}, spec::kInputNames,
                               shape);
      }
      if (error.empty()) {
        error = CheckStatePair(arg(In::kMaxExpAvgSq).present,
                               OutputWired(context, spec::Index(Out::kMaxExpAvgSqOut)),
                               spec::kInputNames[spec::Index(In::kMaxExpAvgSq)],
                               spec::kOutputNames[spec::Index(Out::kMaxExpAvgSqOut)], "amsgrad");
      }
      AdamHyperparameters h;
      for (const auto& [port, value] : std::array<std::pair<In, double*>, 6>{{
               {In::kLr, &h.lr},
               {In::kStep, &h.step},
               {In::kBeta1, &h.beta1},
               {In::kBeta2, &h.beta2},
               {In::kEps, &h.eps},
               {In::kWeightDecay, &h.weight_decay},
           }}) {
        if (error.empty() && arg(port).present) {
          error = ReadScalar(arg(port), spec::kInputNames[spec::Index(port)], value);
        }
      }
      if (!error.empty()) return Fail(spec::kName, node_, error);
      h.decoupled_weight_decay = decoupled_weight_decay_;
      h.maximize = maximize_;

      AdamTensors<T> t;
      // ORT holds the tensor, so its element count fits; checked all the same.
      const std::optional<int64_t> count = CheckedProduct(shape);
      if (!count) return Fail(spec::kName, node_, "input param: shape " + FormatShape(shape) + " overflows");
      t.count = *count;
      t.param = arg(In::kParam).template Data<T>();
      t.grad = arg(In::kGrad).template Data<T>();
      t.exp_avg = arg(In::kExpAvg).template Data<T>();
      t.exp_avg_sq = arg(In::kExpAvgSq).template Data<T>();
      t.max_exp_avg_sq = arg(In::kMaxExpAvgSq).template Data<T>();
      std::array<void*, spec::kNumOutputs> out{};
      for (Out port : {Out::kParamOut, Out::kExpAvgOut, Out::kExpAvgSqOut, Out::kMaxExpAvgSqOut}) {
        if (port == Out::kMaxExpAvgSqOut && t.max_exp_avg_sq == nullptr) continue;
        const std::vector<int64_t> out_shape = spec::OutputShape(port, [&](In in) { return arg(in).shape; });
        error = AllocateOutput(context, spec::Index(port), out_shape, &out[spec::Index(port)]);
        if (!error.empty()) {
          return Fail(spec::kName, node_, std::string(spec::kOutputNames[spec::Index(port)]) + ": " + error);
        }
      }
      t.param_out = static_cast<T*>(out[spec::Index(Out::kParamOut)]);
      t.exp_avg_out = static_cast<T*>(out[spec::Index(Out::kExpAvgOut)]);
      t.exp_avg_sq_out = static_cast<T*>(out[spec::Index(Out::kExpAvgSqOut)]);
      t.max_exp_avg_sq_out = static_cast<T*>(out[spec::Index(Out::kMaxExpAvgSqOut)]);
      AdamUpdate<T>(AdamScalarsFor<T>(h), t, OrtExecutor(context));
      return nullptr;
    } catch (const std::bad_alloc&) {
      return OutOfMemory(spec::kName, node_);
    }
  }

 private:
  bool decoupled_weight_decay_;
  bool maximize_;
  std::string node_;
};

template <typename T>
class SgdUpdateKernel {
 public:
  SgdUpdateKernel(const std::array<int64_t, 2>& flags, std::string node)
      : nesterov_(flags[0] == 1), maximize_(flags[1] == 1), node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    namespace spec = schema::sgd_update;
    using In = spec::In;
    using Out = spec::Out;
    try {
      std::array<TensorArg, spec::kNumInputs> inputs;
      auto arg = [&](In port) -> const TensorArg& { return inputs[spec::Index(port)]; };
      auto name = [](In port) { return spec::kInputNames[spec::Index(port)]; };
      std::string error = ReadInputs(context, &inputs, spec::kInputOptional, spec::kInputNames);
      const std::vector<int64_t>& shape = arg(In::kParam).shape;
      if (error.empty()) error = CheckSameShape(inputs, {In::kGrad, In::kMomentumBuffer}, spec::kInputNames, shape);
      const bool with_momentum = arg(In::kMomentumBuffer).present;
      if (error.empty()) {
        error = CheckStatePair(with_momentum, OutputWired(context, spec::Index(Out::kMomentumBufferOut)),
                               name(In::kMomentumBuffer), spec::kOutputNames[spec::Index(Out::kMomentumBufferOut)],
                               "momentum");
      }
      SgdHyperparameters h;
      for (const auto& [port, value] : std::array<std::pair<In, double*>, 5>{{
               {In::kLr, &h.lr},
               {In::kStep, &h.step},
               {In::kMomentum, &h.momentum},
               {In::kDampening, &h.dampening},
               {In::kWeightDecay, &h.weight_decay},
           }}) {
        if (error.empty() && arg(port).present) error = ReadScalar(arg(port), name(port), value);
      }
      if (error.empty() && with_momentum) {
        for (In port : {In::kStep, In::kMomentum}) {
          if (error.empty() && !arg(port).present) {
            error = std::string("input ") + name(port) + ": required with input " + name(In::kMomentumBuffer);
          }
        }
        if (error.empty() && !(h.momentum > 0.0)) {
          error = std::string("input momentum: expected a value > 0 with a momentum buffer, got ") +
                  std::to_string(h.momentum);
        }
      }
      if (error.empty() && !with_momentum && arg(In::kMomentum).present) {
        error = std::string("input momentum: given without input ") + name(In::kMomentumBuffer) +
                " (momentum needs its buffer)";
      }
      if (error.empty() && nesterov_ && !with_momentum) {
        error = std::string("attribute nesterov: 1 needs input ") + name(In::kMomentumBuffer);
      }
      if (!error.empty()) return Fail(spec::kName, node_, error);
      h.nesterov = nesterov_;
      h.maximize = maximize_;

      SgdTensors<T> t;
      const std::optional<int64_t> count = CheckedProduct(shape);
      if (!count) return Fail(spec::kName, node_, "input param: shape " + FormatShape(shape) + " overflows");
      t.count = *count;
      t.param = arg(In::kParam).template Data<T>();
      t.grad = arg(In::kGrad).template Data<T>();
      t.momentum_buffer = arg(In::kMomentumBuffer).template Data<T>();
      std::array<void*, spec::kNumOutputs> out{};
      for (Out port : {Out::kParamOut, Out::kMomentumBufferOut}) {
        if (port == Out::kMomentumBufferOut && !with_momentum) continue;
        const std::vector<int64_t> out_shape = spec::OutputShape(port, [&](In in) { return arg(in).shape; });
        error = AllocateOutput(context, spec::Index(port), out_shape, &out[spec::Index(port)]);
        if (!error.empty()) {
          return Fail(spec::kName, node_, std::string(spec::kOutputNames[spec::Index(port)]) + ": " + error);
        }
      }
      t.param_out = static_cast<T*>(out[spec::Index(Out::kParamOut)]);
      t.momentum_buffer_out = static_cast<T*>(out[spec::Index(Out::kMomentumBufferOut)]);
      SgdUpdate<T>(SgdScalarsFor<T>(h), t, OrtExecutor(context));
      return nullptr;
    } catch (const std::bad_alloc&) {
      return OutOfMemory(spec::kName, node_);
    }
  }

 private:
  bool nesterov_;
  bool maximize_;
  std::string node_;
};

// What OptimizerOp reads: the op's generated traits (ports, kInputIsDouble, its two 0/1 int attributes in
// the spec's order: the kernel's flags) and its kernel.
struct AdamTraits : schema::adam_update::Traits {
  template <typename T>
  using Kernel = AdamUpdateKernel<T>;
};

struct SgdTraits : schema::sgd_update::Traits {
  template <typename T>
  using Kernel = SgdUpdateKernel<T>;
};

template <typename Traits, typename T>
struct OptimizerOp : SchemaOp<OptimizerOp<Traits, T>, typename Traits::template Kernel<T>, Traits, T> {

  OrtStatus* CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    const std::string node = NodeName(info);
    std::array<int64_t, 2> flags{};
    static_assert(Traits::kNumIntAttributes == flags.size(), "the kernel takes two 0/1 int attributes");
    for (size_t i = 0; i < flags.size(); ++i) {
      const auto& [name, fallback] = Traits::kIntAttributes[i];
      std::string error = ReadIntAttribute(info, name, fallback, &flags[i]);
      if (error.empty() && flags[i] != 0 && flags[i] != 1) {
        error = std::string("attribute ") + name + ": expected 0 or 1, got " + std::to_string(flags[i]);
      }
      if (!error.empty()) return Fail(Traits::kName, node, error);
    }
    return OptimizerOp::NewKernel(kernel, flags, node);
  }

  ONNXTensorElementDataType GetInputType(size_t index) const {
    return Traits::kInputIsDouble[index] ? ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE : kElementType<T>;
  }
};

// Static storage: ORT keeps pointers to the op definitions for the life of every session.
OptimizerOp<AdamTraits, float> g_adam_float;
OptimizerOp<AdamTraits, double> g_adam_double;
OptimizerOp<SgdTraits, float> g_sgd_float;
OptimizerOp<SgdTraits, double> g_sgd_double;

}  // namespace

std::string AddOptimizerOps(OrtCustomOpDomain* domain) {
  return AddOps(domain, {&g_adam_float, &g_adam_double, &g_sgd_float, &g_sgd_double});
}

}  // namespace ortlstm::ort
