// ConvGrad as an ORT custom op. Port order comes from the generated schema (com.microsoft
// ConvGrad's: dY, X, W -> dX, dW, dB, each output optional).
#include "ort/conv_ops.h"

#include <array>
#include <new>
#include <string>
#include <type_traits>

#include "conv/conv_grad.h"
#include "generated/op_schema.h"
#include "ort/conv_validation.h"
#include "ort/schema_op.h"

namespace ortlstm::ort {
namespace {

namespace spec = schema::conv_grad;

template <typename T>
class ConvGradKernel {
 public:
  ConvGradKernel(ConvAttributes attributes, std::string node)
      : attributes_(std::move(attributes)), node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    using In = spec::In;
    using Out = spec::Out;
    try {
      std::array<TensorArg, spec::kNumInputs> inputs;
      auto arg = [&](In port) -> const TensorArg& { return inputs[spec::Index(port)]; };
      std::string error = ReadInputs(context, &inputs, spec::kInputOptional, spec::kInputNames);
      conv::ConvDims dims;
      if (error.empty()) error = ValidateConvGradInputs(attributes_, arg(In::kDY), arg(In::kX), arg(In::kW), &dims);
      if (!error.empty()) return Fail(spec::kName, node_, error);

      void* grad_x = nullptr;
      void* grad_w = nullptr;
      void* grad_b = nullptr;
      auto shape_of = [&](In port) { return arg(port).shape; };
      error = AllocateOutput(context, spec::Index(Out::kDX), spec::OutputShape(Out::kDX, shape_of), &grad_x);
      if (error.empty()) {
        error = AllocateOutput(context, spec::Index(Out::kDW), spec::OutputShape(Out::kDW, shape_of), &grad_w);
      }
      if (error.empty()) {
        error = AllocateOutput(context, spec::Index(Out::kDB), spec::OutputShape(Out::kDB, shape_of), &grad_b);
      }
      if (!error.empty()) return Fail(spec::kName, node_, error);
      OrtScratchAllocator allocator(context);
      conv::ConvGrad<T>(dims, arg(In::kDY).template Data<T>(), arg(In::kX).template Data<T>(),
                        arg(In::kW).template Data<T>(), static_cast<T*>(grad_x), static_cast<T*>(grad_w),
                        static_cast<T*>(grad_b), OrtExecutor(context), allocator, attributes_.matmul_precision);
      return nullptr;
    } catch (const std::bad_alloc&) {
      return OutOfMemory(spec::kName, node_);
    }
  }

 private:
  ConvAttributes attributes_;
  std::string node_;
};

// What SchemaOp reads of the generated schema.
using ConvGradTraits = spec::Traits;

template <typename T>
struct ConvGradOp : SchemaOp<ConvGradOp<T>, ConvGradKernel<T>, ConvGradTraits, T> {
  OrtStatus* CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    const std::string node = NodeName(info);
    ConvAttributes attributes;
    std::string error = ReadConvAttributes(info, &attributes);
    if (error.empty()) error = RefuseBf16Tensors<T>(attributes.matmul_precision);
    if (!error.empty()) return Fail(ConvGradTraits::kName, node, error);
    return ConvGradOp::NewKernel(kernel, std::move(attributes), node);
  }

  ONNXTensorElementDataType GetInputType(size_t) const { return kElementType<T>; }
};

// Static storage: ORT keeps pointers to the op definitions for the life of every session.
ConvGradOp<float> g_conv_grad_float;
ConvGradOp<double> g_conv_grad_double;

}  // namespace

std::string AddConvOps(OrtCustomOpDomain* domain) { return AddOps(domain, {&g_conv_grad_float, &g_conv_grad_double}); }

}  // namespace ortlstm::ort
