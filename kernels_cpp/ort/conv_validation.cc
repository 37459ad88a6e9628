// ConvGrad's attribute and shape checks. Dims come from X ([N, C, in...]) and W ([M, C/G, k...]);
// the output grid follows from them and the attributes, and dY must have it. Every product of
// dims the math forms is bounded here, so the math cannot overflow.
#include "ort/conv_validation.h"

#include <sstream>

#include "common/checked_math.h"
#include "generated/op_schema.h"

namespace ortlstm::ort {
namespace {

namespace spec = schema::conv_grad;
namespace limits = schema::limits;

// "" if every value of a present list is >= minimum; else a message naming the attribute.
std::string CheckAtLeast(const std::optional<std::vector<int64_t>>& values, const char* name, int64_t minimum) {
  if (!values) return "";
  for (size_t i = 0; i < values->size(); ++i) {
    if ((*values)[i] < minimum) {
      return std::string("attribute ") + name + ": expected integers >= " + std::to_string(minimum) + ", got " +
             FormatShape(*values);
    }
  }
  return "";
}

// The list, or `fill` repeated `count` times when the node omits it; a message when its length is not `count`.
std::string PerAxis(const std::optional<std::vector<int64_t>>& values, const char* name, size_t count, int64_t fill,
                    const std::string& what, std::vector<int64_t>* out) {
  if (!values) {
    out->assign(count, fill);
    return "";
  }
  if (values->size() != count) {
    return std::string("attribute ") + name + ": expected " + std::to_string(count) + " integers (" + what +
           "), got " + std::to_string(values->size()) + ": " + FormatShape(*values);
  }
  *out = *values;
  return "";
}

}  // namespace

std::string ReadConvAttributes(const OrtKernelInfo* info, ConvAttributes* attributes) {
  std::string error =
      ReadStringAttribute(info, spec::kAttrAutoPad, spec::kAttrAutoPadDefault, &attributes->auto_pad);
  if (error.empty()) error = ReadIntAttribute(info, spec::kAttrGroup, spec::kAttrGroupDefault, &attributes->group);
  if (error.empty()) error = ReadIntsAttribute(info, spec::kAttrDilations, &attributes->dilations);
  if (error.empty()) error = ReadIntsAttribute(info, spec::kAttrKernelShape, &attributes->kernel_shape);
  if (error.empty()) error = ReadIntsAttribute(info, spec::kAttrPads, &attributes->pads);
  if (error.empty()) error = ReadIntsAttribute(info, spec::kAttrStrides, &attributes->strides);
  std::string precision;
  if (error.empty()) {
    error = ReadStringAttribute(info, spec::kAttrMatmulPrecision, spec::kAttrMatmulPrecisionDefault, &precision);
  }
  if (error.empty()) error = ParseMatmulPrecision(precision, &attributes->matmul_precision);
  if (!error.empty()) return error;
  const std::string& auto_pad = attributes->auto_pad;
  if (auto_pad != "NOTSET" && auto_pad != "VALID" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER") {
    return "attribute auto_pad: expected NOTSET, VALID, SAME_UPPER or SAME_LOWER, got '" + auto_pad + "'";
  }
  if (auto_pad != "NOTSET" && attributes->pads && !attributes->pads->empty()) {
    return "attribute pads: given together with auto_pad=" + auto_pad +
           ", which sets the padding itself; pass one of them (pads with auto_pad=NOTSET)";
  }
  if (attributes->group < 1) {
    return "attribute group: expected an integer >= 1, got " + std::to_string(attributes->group);
  }
  if (error.empty()) error = CheckAtLeast(attributes->dilations, spec::kAttrDilations, 1);
  if (error.empty()) error = CheckAtLeast(attributes->strides, spec::kAttrStrides, 1);
  if (error.empty()) error = CheckAtLeast(attributes->kernel_shape, spec::kAttrKernelShape, 1);
  if (error.empty()) error = CheckAtLeast(attributes->pads, spec::kAttrPads, 0);
  return error;
}

std::string ValidateConvGradInputs(const ConvAttributes& attributes, const TensorArg& grad_y, const TensorArg& x,
                                   const TensorArg& w, conv::ConvDims* dims) {
  if (x.shape.size() < 3) {
    return "X: expected rank >= 3 [N, C, in...] (batch, channels, at least one spatial axis), got shape " +
           FormatShape(x.shape);
  }
  const size_t rank = x.shape.size();
  const size_t spatial = rank - 2;
  if (w.shape.size() != rank) {
    return "W: expected rank " + std::to_string(rank) + " [M, C/group, k...] (X's rank), got shape " +
           FormatShape(w.shape);
  }
  const int64_t group = attributes.group;
  dims->batch_size = x.shape[0];
  dims->channels = x.shape[1];
  dims->maps = w.shape[0];
  dims->group = group;
  if (dims->channels % group != 0) {
    return "X: C=" + std::to_string(dims->channels) + " channels are not divisible by group=" + std::to_string(group) +
           "; pass the forward Conv's group";
  }
  if (w.shape[1] * group != dims->channels) {
    return "W: expected shape [M, C/group=" + std::to_string(dims->channels / group) +
           ", k...] for X with C=" + std::to_string(dims->channels) + " channels and group=" + std::to_string(group) +
           ", got " + FormatShape(w.shape);
  }
  if (dims->maps % group != 0) {
    return "W: M=" + std::to_string(dims->maps) + " maps (its first axis) are not divisible by group=" +
           std::to_string(group) + "; pass the forward Conv's group";
  }
  dims->input_spatial.assign(x.shape.begin() + 2, x.shape.end());
  dims->kernel.assign(w.shape.begin() + 2, w.shape.end());
  if (attributes.kernel_shape && *attributes.kernel_shape != dims->kernel) {
    return "attribute kernel_shape: expected W's spatial dims " + FormatShape(dims->kernel) + ", got " +
           FormatShape(*attributes.kernel_shape);
  }
  for (size_t axis = 0; axis < spatial; ++axis) {
    if (dims->kernel[axis] < 1) return "W: expected spatial dims >= 1, got shape " + FormatShape(w.shape);
  }
  const std::string per_axis = "one per spatial axis of X " + FormatShape(x.shape);
  std::string error = PerAxis(attributes.strides, spec::kAttrStrides, spatial, 1, per_axis, &dims->strides);
  if (error.empty()) {
    error = PerAxis(attributes.dilations, spec::kAttrDilations, spatial, 1, per_axis, &dims->dilations);
  }
  std::vector<int64_t> pads;
  if (error.empty()) {
    error = PerAxis(attributes.auto_pad == "NOTSET" ? attributes.pads : std::nullopt, spec::kAttrPads, 2 * spatial, 0,
                    "begin then end pads of each spatial axis of X " + FormatShape(x.shape), &pads);
  }
  if (!error.empty()) return error;

  dims->pads_begin.assign(spatial, 0);
  dims->output_spatial.assign(spatial, 0);
  for (size_t axis = 0; axis < spatial; ++axis) {
    const int64_t in = dims->input_spatial[axis];
    const int64_t stride = dims->strides[axis];
    const std::optional<int64_t> span =
        CheckedProduct(std::vector<int64_t>{dims->kernel[axis] - 1, dims->dilations[axis]});
    if (!span || *span > limits::kMaxBufferElements) return "attribute dilations: the dilated kernel overflows";
    const int64_t extent = *span + 1;  // the dilated kernel's extent
    int64_t out = 0;
    if (attributes.auto_pad == "SAME_UPPER" || attributes.auto_pad == "SAME_LOWER") {
      out = (in + stride - 1) / stride;
      const int64_t total = std::max<int64_t>((out - 1) * stride + extent - in, 0);
      dims->pads_begin[axis] = attributes.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    } else {
      const int64_t begin = pads[axis];
      const int64_t end = pads[axis + spatial];
      if (begin > limits::kMaxBufferElements || end > limits::kMaxBufferElements) {
        return "attribute pads: expected values below 2^60, got " + FormatShape(pads);
      }
      dims->pads_begin[axis] = begin;
      const int64_t padded = in + begin + end;
      if (padded < extent) {
        std::ostringstream msg;
        msg << "X: spatial axis " << axis << " of size " << in << ", padded to " << padded
            << ", is smaller than the dilated kernel's extent " << extent << ": no output position";
        return msg.str();
      }
      out = (padded - extent) / stride + 1;
    }
    dims->output_spatial[axis] = out;
  }
  std::vector<int64_t> expected{dims->batch_size, dims->maps};
  expected.insert(expected.end(), dims->output_spatial.begin(), dims->output_spatial.end());
  if (grad_y.shape != expected) {
    return "dY: expected shape " + FormatShape(expected) +
           " ([N, M, out...], the forward Conv's output for X " + FormatShape(x.shape) + " and W " +
           FormatShape(w.shape) + " with these attributes), got " + FormatShape(grad_y.shape);
  }
  // Every buffer and GEMM dim the math forms.
  const std::optional<int64_t> in_size = CheckedProduct(dims->input_spatial, limits::kMaxBufferElements);
  const std::optional<int64_t> out_size = CheckedProduct(dims->output_spatial, limits::kBlasDim);
  const std::optional<int64_t> rows =
      CheckedProduct(std::vector<int64_t>{w.shape[1], CheckedProduct(dims->kernel, limits::kBlasDim).value_or(-1)},
                     limits::kBlasDim);
  if (!in_size || !CheckedProduct(x.shape, limits::kMaxBufferElements) ||
      !CheckedProduct(w.shape, limits::kMaxBufferElements) ||
      !CheckedProduct(grad_y.shape, limits::kMaxBufferElements)) {
    return "X, W or dY: more elements than a buffer can index (shapes " + FormatShape(x.shape) + ", " +
           FormatShape(w.shape) + ", " + FormatShape(grad_y.shape) + ")";
  }
  if (!out_size || !rows || dims->maps / group > limits::kBlasDim) {
    return "X, W or dY: a GEMM dim (output positions, C/group * kernel taps, or M/group) exceeds 2^31 - 1";
  }
  const std::optional<int64_t> columns =
      CheckedProduct(std::vector<int64_t>{*rows, *out_size, dims->batch_size > 0 ? 64 : 1}, limits::kMaxBufferElements);
  if (!columns) return "X: the im2col scratch (C/group * kernel taps * output positions, per thread) is too large";
  return "";
}

}  // namespace ortlstm::ort
