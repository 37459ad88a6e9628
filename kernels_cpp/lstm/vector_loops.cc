// See vector_loops.h.
#include "lstm/vector_loops.h"

#include "lstm/fast_math.h"

namespace ortlstm {

namespace {

// GCC honours __restrict on parameters: the loops live here, inlined into each clone below.
template <typename T>
inline __attribute__((always_inline)) void AddLoop(const T* __restrict from, T* __restrict to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) to[i] += from[i];
}

template <typename T>
inline __attribute__((always_inline)) void SigmoidPrimeLoop(const T* __restrict y, T* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = y[i] * (T(1) - y[i]);
}

template <typename T>
inline __attribute__((always_inline)) void TanhPrimeLoop(const T* __restrict y, T* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = T(1) - y[i] * y[i];
}

}  // namespace

ORTLSTM_VECTOR_CLONES void AddInto(const float* from, float* to, int64_t n) { AddLoop(from, to, n); }
ORTLSTM_VECTOR_CLONES void AddInto(const double* from, double* to, int64_t n) { AddLoop(from, to, n); }
ORTLSTM_VECTOR_CLONES void SigmoidDerivativesFromOutputs(const float* y, float* out, int64_t n) {
  SigmoidPrimeLoop(y, out, n);
}
ORTLSTM_VECTOR_CLONES void SigmoidDerivativesFromOutputs(const double* y, double* out, int64_t n) {
  SigmoidPrimeLoop(y, out, n);
}
ORTLSTM_VECTOR_CLONES void TanhDerivativesFromOutputs(const float* y, float* out, int64_t n) {
  TanhPrimeLoop(y, out, n);
}
ORTLSTM_VECTOR_CLONES void TanhDerivativesFromOutputs(const double* y, double* out, int64_t n) {
  TanhPrimeLoop(y, out, n);
}

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
