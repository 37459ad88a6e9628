// ORT custom-op definitions of the optimizer ops (ops/schema.py OPTIMIZER_OPS) for float and
// double: AdamUpdate and SGDUpdate read and check their inputs, allocate their outputs and call
// optim/adam.h and optim/sgd.h.
#pragma once

#include <string>

#include "ort/ort_util.h"

namespace ortlstm::ort {

// Appends the op definitions (AdamUpdate and SGDUpdate x two element types) to `domain`.
std::string AddOptimizerOps(OrtCustomOpDomain* domain);

}  // namespace ortlstm::ort
