// ConvGrad's attributes, read and checked once when the session is created, and its runtime
// checks, done once per call before any math: ranks, shapes, the group split, the output grid dY
// must have. Each returns "" or a message naming the input or attribute with expected vs actual.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "conv/conv_grad.h"
#include "ort/ort_util.h"

namespace ortlstm::ort {

// The forward Conv's attributes as the node gives them (lists unchecked against the rank yet).
struct ConvAttributes {
  std::string auto_pad = "NOTSET";  // NOTSET, VALID, SAME_UPPER or SAME_LOWER
  int64_t group = 1;
  std::optional<std::vector<int64_t>> dilations;
  std::optional<std::vector<int64_t>> kernel_shape;
  std::optional<std::vector<int64_t>> pads;
  std::optional<std::vector<int64_t>> strides;
  MatmulPrecision matmul_precision = MatmulPrecision::kFloat32;
};

std::string ReadConvAttributes(const OrtKernelInfo* info, ConvAttributes* attributes);

// Validates dY, X and W against each other and the attributes and fills the dims the math takes.
std::string ValidateConvGradInputs(const ConvAttributes& attributes, const TensorArg& grad_y, const TensorArg& x,
                                   const TensorArg& w, conv::ConvDims* dims);

}  // namespace ortlstm::ort
