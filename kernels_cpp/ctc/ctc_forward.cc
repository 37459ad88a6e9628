// The CTC forward: log_alpha and the loss of each sample, one task per sample. Equations:
// docs/ops.md#ctcloss; layout: ctc/ctc_loss.h. Works in log space throughout, so nothing
// underflows however long the input (a probability of e^-10000 is just -10000).
#include <algorithm>

#include "ctc/ctc_loss.h"
#include "ctc/ctc_math.h"

namespace ortlstm::ctc {
namespace {

template <typename T>
void ForwardSample(const CtcDims& dims, const CtcTargets& targets, int64_t n, const T* log_probs, T* log_alpha,
                   T* loss) {
  const int64_t num_states = dims.NumStates();
  // [max_time, num_states], sample n's block of log_alpha; -inf where the recursion does not reach.
  T* alpha = log_alpha + n * dims.max_time * num_states;
  std::fill(alpha, alpha + dims.max_time * num_states, kNegInf<T>);
  const ExtendedTarget target(dims, targets, n);
  // Row t of sample n in log_probs: [num_classes].
  auto log_probs_row = [&](int64_t t) { return log_probs + (t * dims.batch_size + n) * dims.num_classes; };

  if (target.input_length > 0) {
    // alpha_0(0) = y_0(blank), alpha_0(1) = y_0(l_1); every other state starts unreachable.
    alpha[0] = log_probs_row(0)[dims.blank];
    if (target.target_length > 0) alpha[1] = log_probs_row(0)[target.state_class[1]];
    for (int64_t t = 1; t < target.input_length; ++t) {
      const T* previous = alpha + (t - 1) * num_states;
      T* current = alpha + t * num_states;
      const T* y = log_probs_row(t);
      // alpha_t(s) = log(e^alpha_{t-1}(s) + e^alpha_{t-1}(s-1) [+ e^alpha_{t-1}(s-2) if l'_s != l'_{s-2}]) + y_t(l'_s)
      for (int64_t s = 0; s < target.NumStates(); ++s) {
        const T stay = previous[s];
        const T advance = s > 0 ? previous[s - 1] : kNegInf<T>;
        const T skip = target.can_skip[static_cast<size_t>(s)] ? previous[s - 2] : kNegInf<T>;
        current[s] = LogSumExp3(stay, advance, skip) + y[target.state_class[static_cast<size_t>(s)]];
      }
    }
  }
  const T* last_row = alpha + std::max<int64_t>(target.input_length - 1, 0) * num_states;
  const T nll = NegLogLikelihood(target, last_row);
  loss[n] = dims.zero_infinity && nll == std::numeric_limits<T>::infinity() ? T(0) : nll;
}

}  // namespace

template <typename T>
void CtcForward(const CtcDims& dims, const CtcTargets& targets, const T* log_probs, T* log_alpha, T* loss,
                const Executor& executor) {
  executor.For(static_cast<std::size_t>(dims.batch_size), [&](std::size_t n) {
    ForwardSample(dims, targets, static_cast<int64_t>(n), log_probs, log_alpha, loss);
  });
}

template void CtcForward<float>(const CtcDims&, const CtcTargets&, const float*, float*, float*, const Executor&);
template void CtcForward<double>(const CtcDims&, const CtcTargets&, const double*, double*, double*, const Executor&);

}  // namespace ortlstm::ctc
