// SigmoidGrad and TanhGrad: one vectorizable loop per chunk. The build's -ffp-contract=off keeps
// the multiplies and subtractions unfused, so each element equals the standard ops' result.
#include "pointwise/activation_grad.h"

#include <algorithm>

namespace ortlstm::pointwise {
namespace {

// Elements per task: enough work to outweigh handing a task to a thread.
constexpr int64_t kChunk = 16384;

template <typename T>
void SigmoidGradRange(int64_t begin, int64_t end, const T* grad_y, const T* y, T* grad_x) {
  for (int64_t i = begin; i < end; ++i) grad_x[i] = grad_y[i] * (y[i] * (T(1) - y[i]));
}

template <typename T>
void TanhGradRange(int64_t begin, int64_t end, const T* grad_y, const T* y, T* grad_x) {
  for (int64_t i = begin; i < end; ++i) grad_x[i] = grad_y[i] * (T(1) - y[i] * y[i]);
}

}  // namespace

template <typename T>
void ActivationGrad(Activation activation, int64_t count, const T* grad_y, const T* y, T* grad_x,
                    const Executor& executor) {
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(executor.Width(), (count + kChunk - 1) / kChunk));
  executor.For(static_cast<size_t>(parts), [&](size_t part) {
    const Range range = SplitRange(count, parts, static_cast<int64_t>(part));
    if (activation == Activation::kSigmoid) {
      SigmoidGradRange(range.begin, range.end, grad_y, y, grad_x);
    } else {
      TanhGradRange(range.begin, range.end, grad_y, y, grad_x);
    }
  });
}

template void ActivationGrad<float>(Activation, int64_t, const float*, const float*, float*, const Executor&);
template void ActivationGrad<double>(Activation, int64_t, const double*, const double*, double*, const Executor&);

}  // namespace ortlstm::pointwise
