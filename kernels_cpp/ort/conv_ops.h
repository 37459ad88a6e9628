// ORT custom-op definitions of ConvGrad (ops/schema.py CONV_OPS) for float and double: reads and
// validates dY, X and W (ort/conv_validation.h), allocates the outputs the node asks for and
// calls conv/conv_grad.h.
#pragma once

#include <string>

#include "ort/ort_util.h"

namespace ortlstm::ort {

// Appends the op definitions (ConvGrad x two element types) to `domain`.
std::string AddConvOps(OrtCustomOpDomain* domain);

}  // namespace ortlstm::ort
