// SigmoidGrad and TanhGrad as ORT custom ops. Both have the ports dY, Y -> dX (the generated
// schema's; com.microsoft's order); Traits pick the op's name and the activation.
#include "ort/activation_grad_ops.h"

#include <array>
#include <new>
#include <string>

#include "common/checked_math.h"
#include "generated/op_schema.h"
#include "ort/schema_op.h"
#include "pointwise/activation_grad.h"

namespace ortlstm::ort {
namespace {

// Both ops have the same ports in the same places (checked below), so SigmoidGrad's generated
// constants serve both; only the name differs.
using In = schema::sigmoid_grad::In;
using Out = schema::sigmoid_grad::Out;
static_assert(schema::sigmoid_grad::kNumInputs == schema::tanh_grad::kNumInputs);
static_assert(schema::sigmoid_grad::kNumOutputs == schema::tanh_grad::kNumOutputs);
static_assert(schema::sigmoid_grad::Index(In::kDY) == schema::tanh_grad::Index(schema::tanh_grad::In::kDY));
static_assert(schema::sigmoid_grad::Index(In::kY) == schema::tanh_grad::Index(schema::tanh_grad::In::kY));

// The op's generated traits (name and ports) and its activation.
template <pointwise::Activation kActivation, typename OpTraits>
struct ActivationGradTraits : OpTraits {
  static constexpr pointwise::Activation kWhich = kActivation;
};

template <typename Traits, typename T>
class ActivationGradKernel {
 public:
  explicit ActivationGradKernel(std::string node) : node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    namespace spec = schema::sigmoid_grad;
    try {
      std::array<TensorArg, spec::kNumInputs> inputs;
      const char* const(&names)[spec::kNumInputs] = spec::kInputNames;
      std::string error = ReadInputs(context, &inputs, spec::kInputOptional, names);
      const TensorArg& grad_y = inputs[spec::Index(In::kDY)];
      const TensorArg& y = inputs[spec::Index(In::kY)];
      if (error.empty() && grad_y.shape != y.shape) {
        error = "dY: expected Y's shape " + FormatShape(y.shape) + ", got " + FormatShape(grad_y.shape);
      }
      const std::optional<int64_t> count = CheckedProduct(y.shape);
      if (error.empty() && !count) error = "Y: shape " + FormatShape(y.shape) + " overflows";
      if (!error.empty()) return Fail(Traits::kName, node_, error);
      void* grad_x = nullptr;
      error = AllocateOutput(context, spec::Index(Out::kDX),
                             spec::OutputShape(Out::kDX, [&](In port) { return inputs[spec::Index(port)].shape; }),
                             &grad_x);
      if (!error.empty()) return Fail(Traits::kName, node_, error);
      pointwise::ActivationGrad<T>(Traits::kWhich, *count, grad_y.template Data<T>(), y.template Data<T>(),
                                   static_cast<T*>(grad_x), OrtExecutor(context));
      return nullptr;
    } catch (const std::bad_alloc&) {
      return OutOfMemory(Traits::kName, node_);
    }
  }

 private:
  std::string node_;
};

template <typename Traits, typename T>
struct ActivationGradOp : SchemaOp<ActivationGradOp<Traits, T>, ActivationGradKernel<Traits, T>, Traits, T> {
  OrtStatus* CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return ActivationGradOp::NewKernel(kernel, NodeName(info));
  }

  ONNXTensorElementDataType GetInputType(size_t) const { return kElementType<T>; }
};

using SigmoidGradTraits = ActivationGradTraits<pointwise::Activation::kSigmoid, schema::sigmoid_grad::Traits>;
using TanhGradTraits = ActivationGradTraits<pointwise::Activation::kTanh, schema::tanh_grad::Traits>;

// Static storage: ORT keeps pointers to the op definitions for the life of every session.
ActivationGradOp<SigmoidGradTraits, float> g_sigmoid_grad_float;
ActivationGradOp<SigmoidGradTraits, double> g_sigmoid_grad_double;
ActivationGradOp<TanhGradTraits, float> g_tanh_grad_float;
ActivationGradOp<TanhGradTraits, double> g_tanh_grad_double;

}  // namespace

std::string AddActivationGradOps(OrtCustomOpDomain* domain) {
  return AddOps(domain, {&g_sigmoid_grad_float, &g_sigmoid_grad_double, &g_tanh_grad_float, &g_tanh_grad_double});
}

}  // namespace ortlstm::ort
