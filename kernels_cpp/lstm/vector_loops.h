// Activation loops over float arrays, compiled for AVX-512, AVX2 and baseline x86-64 and picked at
// load time (GCC function multi-versioning), so one wheel runs everywhere and uses the widest
// vectors the CPU has. Each element goes through the same operations as the scalar
// FastSigmoid/FastTanh, so results are bit-identical across the versions and the scalar path.
#pragma once

#include <cstdint>

namespace ortlstm {

void SigmoidInPlace(float* x, int64_t n);
void TanhInPlace(float* x, int64_t n);
// out[i] = 1 - tanh(x[i])^2
void TanhDerivatives(const float* x, float* out, int64_t n);

}  // namespace ortlstm
