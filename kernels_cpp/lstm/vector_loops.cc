// See vector_loops.h. target_clones needs an ELF platform with ifunc (glibc); elsewhere the
// loops are built once for the baseline: on aarch64 that has NEON (armv8-a), which the compiler
// vectorises them for (scripts/build_wheels.sh checks the disassembly).
#include "lstm/vector_loops.h"

#include "lstm/fast_math.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && !defined(__clang__)
#define ORTLSTM_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ORTLSTM_VECTOR_CLONES
#endif

namespace ortlstm {

ORTLSTM_VECTOR_CLONES void SigmoidInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = SigmoidFloat(x[i]);
}

ORTLSTM_VECTOR_CLONES void TanhInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = TanhFloat(x[i]);
}

ORTLSTM_VECTOR_CLONES void TanhDerivatives(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float y = TanhFloat(x[i]);
    out[i] = 1.0f - y * y;
  }
}

}  // namespace ortlstm
