// ORT custom-op definitions of the optimizer ops (ops/schema.py OPTIMIZER_OPS) for float and
// double: AdamUpdate reads and checks its inputs, allocates its outputs and calls optim/adam.h.
#pragma once

#include <string>

#include "ort/ort_util.h"

namespace ortlstm::ort {

// Appends the op definitions (AdamUpdate x two element types) to `domain`.
std::string AddOptimizerOps(OrtCustomOpDomain* domain);

}  // namespace ortlstm::ort
