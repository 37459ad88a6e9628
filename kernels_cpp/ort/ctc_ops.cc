// CTCLoss and CTCLossGrad as ORT custom ops. Port order comes from the generated schema; the
// integer inputs are declared of any type to ORT (int32 and int64 both pass to one kernel) and
// checked by ort/ctc_validation.cc, which converts them.
#include "ort/ctc_ops.h"

#include <array>
#include <new>
#include <string>
#include <vector>

#include "ctc/ctc_loss.h"
#include "generated/op_schema.h"
#include "ort/ctc_validation.h"
#include "ort/schema_op.h"

namespace ortlstm::ort {
namespace {

// blank and zero_infinity, parsed and checked once when the session is created.
struct CtcAttributes {
  int64_t blank = 0;
  bool zero_infinity = false;
};

// Both ops declare the same attributes (ops/schema.py _CTC_ATTRIBUTES), so CTCLoss's names serve both.
std::string ReadCtcAttributes(const OrtKernelInfo* info, CtcAttributes* attributes) {
  namespace spec = schema::ctc_loss;
  int64_t zero_infinity = 0;
  std::string error = ReadIntAttribute(info, spec::kAttrBlank, spec::kAttrBlankDefault, &attributes->blank);
  if (error.empty() && attributes->blank < 0) {
    error = std::string("attribute blank: expected an integer >= 0, got ") + std::to_string(attributes->blank);
  }
  if (error.empty())
    error = ReadIntAttribute(info, spec::kAttrZeroInfinity, spec::kAttrZeroInfinityDefault, &zero_infinity);
  if (error.empty() && zero_infinity != 0 && zero_infinity != 1) {
    error = std::string("attribute zero_infinity: expected 0 or 1, got ") + std::to_string(zero_infinity);
  }
  attributes->zero_infinity = zero_infinity == 1;
  return error;
}

// Reads a CTC node's inputs and validates the four both ops take (ort/ctc_validation.h), found at
// `ports` (log_probs, targets, input_lengths, target_lengths); "" or a message.
template <size_t N>
std::string ReadCtcInputs(OrtKernelContext* context, const CtcAttributes& attributes, const bool (&optional)[N],
                          const char* const (&names)[N], const std::array<size_t, 4>& ports,
                          std::array<TensorArg, N>* inputs, ctc::CtcDims* dims, CtcIndices* indices) {
  std::string error = ReadInputs(context, inputs, optional, names);
  if (!error.empty()) return error;
  const auto& in = *inputs;
  return ValidateCtcInputs(in[ports[0]], in[ports[1]], in[ports[2]], in[ports[3]], attributes.blank,
                           attributes.zero_infinity, dims, indices);
}

template <typename T>
class CtcLossKernel {
 public:
  CtcLossKernel(const CtcAttributes& attributes, std::string node) : attributes_(attributes), node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    namespace spec = schema::ctc_loss;
    using In = spec::In;
    using Out = spec::Out;
    try {
      std::array<TensorArg, spec::kNumInputs> inputs;
      auto arg = [&](In port) -> const TensorArg& { return inputs[spec::Index(port)]; };
      ctc::CtcDims dims;
      CtcIndices indices;
      std::string error = ReadCtcInputs(context, attributes_, spec::kInputOptional, spec::kInputNames,
                                        {spec::Index(In::kLogProbs), spec::Index(In::kTargets),
                                         spec::Index(In::kInputLengths), spec::Index(In::kTargetLengths)},
                                        &inputs, &dims, &indices);
      if (!error.empty()) return Fail(spec::kName, node_, error);

      void* loss = nullptr;
      void* log_alpha = nullptr;
      error = AllocateOutput(context, spec::Index(Out::kLoss),
                             spec::OutputShape(Out::kLoss, [&](In port) { return arg(port).shape; }), &loss);
      // 2*S+1 states: S is a value for concatenated targets, which no shape rule reads.
      if (error.empty()) {
        error = AllocateOutput(context, spec::Index(Out::kLogAlpha), {dims.batch_size, dims.max_time, dims.NumStates()},
                               &log_alpha);
      }
      if (!error.empty()) return Fail(spec::kName, node_, error);
      // [N, T, 2*S+1]: the stash, or scratch when the node does not output it.
      std::vector<T> log_alpha_scratch;
      if (log_alpha == nullptr) {
        log_alpha_scratch.resize(static_cast<size_t>(dims.batch_size * dims.max_time * dims.NumStates()));
        log_alpha = log_alpha_scratch.data();
      }
      ctc::CtcForward<T>(dims, indices.view, arg(In::kLogProbs).template Data<T>(), static_cast<T*>(log_alpha),
                         static_cast<T*>(loss), OrtExecutor(context));
      return nullptr;
    } catch (const std::bad_alloc&) {
      return OutOfMemory(spec::kName, node_);
    }
  }

 private:
  CtcAttributes attributes_;
  std::string node_;
};

template <typename T>
class CtcLossGradKernel {
 public:
  CtcLossGradKernel(const CtcAttributes& attributes, std::string node)
      : attributes_(attributes), node_(std::move(node)) {}

  OrtStatus* ComputeV2(OrtKernelContext* context) {
    namespace spec = schema::ctc_loss_grad;
    using In = spec::In;
    using Out = spec::Out;
    try {
      std::array<TensorArg, spec::kNumInputs> inputs;
      auto arg = [&](In port) -> const TensorArg& { return inputs[spec::Index(port)]; };
      ctc::CtcDims dims;
      CtcIndices indices;
      std::string error = ReadCtcInputs(context, attributes_, spec::kInputOptional, spec::kInputNames,
                                        {spec::Index(In::kLogProbs), spec::Index(In::kTargets),
                                         spec::Index(In::kInputLengths), spec::Index(In::kTargetLengths)},
                                        &inputs, &dims, &indices);
      if (error.empty()) error = ValidateCtcGradInputs(dims, arg(In::kGradLoss), arg(In::kLoss), arg(In::kLogAlpha));
      if (!error.empty()) return Fail(spec::kName, node_, error);

      void* grad_log_probs = nullptr;
      error = AllocateOutput(context, spec::Index(Out::kGradLogProbs),
                             spec::OutputShape(Out::kGradLogProbs, [&](In port) { return arg(port).shape; }),
                             &grad_log_probs);
      if (!error.empty()) return Fail(spec::kName, node_, error);
      ctc::CtcBackward<T>(dims, indices.view, arg(In::kGradLoss).template Data<T>(),
                          arg(In::kLogProbs).template Data<T>(), arg(In::kLoss).template Data<T>(),
                          arg(In::kLogAlpha).template Data<T>(), static_cast<T*>(grad_log_probs), OrtExecutor(context));
      return nullptr;
    } catch (const std::bad_alloc&) {
      return OutOfMemory(spec::kName, node_);
    }
  }

 private:
  CtcAttributes attributes_;
  std::string node_;
};

// What CtcOp reads: the op's generated traits (name, ports, kInputIsInteger) and its kernel.
struct CtcLossTraits : schema::ctc_loss::Traits {
  template <typename T>
  using Kernel = CtcLossKernel<T>;
};

struct CtcLossGradTraits : schema::ctc_loss_grad::Traits {
  template <typename T>
  using Kernel = CtcLossGradKernel<T>;
};

template <typename Traits, typename T>
struct CtcOp : SchemaOp<CtcOp<Traits, T>, typename Traits::template Kernel<T>, Traits, T> {

  OrtStatus* CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    const std::string node = NodeName(info);
    CtcAttributes attributes;
    const std::string error = ReadCtcAttributes(info, &attributes);
    if (!error.empty()) return Fail(Traits::kName, node, error);
    return CtcOp::NewKernel(kernel, attributes, node);
  }

  // UNDEFINED: any element type reaches the kernel, which takes int32 and int64 and names others.
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return Traits::kInputIsInteger[index] ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED : kElementType<T>;
  }
};

// Static storage: ORT keeps pointers to the op definitions for the life of every session.
CtcOp<CtcLossTraits, float> g_ctc_loss_float;
CtcOp<CtcLossTraits, double> g_ctc_loss_double;
CtcOp<CtcLossGradTraits, float> g_ctc_loss_grad_float;
CtcOp<CtcLossGradTraits, double> g_ctc_loss_grad_double;

}  // namespace

std::string AddCtcOps(OrtCustomOpDomain* domain) {
  return AddOps(domain, {&g_ctc_loss_float, &g_ctc_loss_double, &g_ctc_loss_grad_float, &g_ctc_loss_grad_double});
}

}  // namespace ortlstm::ort
