// The CTC gradient with respect to log_probs, one task per sample: log_beta backwards in time
// (two rows), alpha*beta collected per class of the extended target, then each row of the
// gradient. Equations: docs/ops.md#ctclossgrad; layout: ctc/ctc_loss.h.
//
// Only the classes of the extended target (at most U+1 of C) collect anything; every other class
// has collected = -inf, so its gradient is exp(y) * grad_loss. That part, C - U - 1 of every row,
// runs as one vectorized loop (ScaledExp: lstm/fast_math.h's float exp, which depends on nothing
// LSTM; libm's in double, as torch's), and only the target's classes take torch's full expression.
#include <algorithm>
#include <cmath>

#include "ctc/ctc_loss.h"
#include "ctc/ctc_math.h"
#include "lstm/fast_math.h"

// target_clones needs an ELF platform with ifunc (glibc); elsewhere the loop is built once for the
// baseline. No FMA clone: the build keeps contraction off, so every clone gives the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && !defined(__clang__)
#define ORTLSTM_CTC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ORTLSTM_CTC_CLONES
#endif

namespace ortlstm::ctc {

// out = e^y * scale over n values: the gradient of every class outside the extended target.
ORTLSTM_CTC_CLONES void ScaledExp(const float* y, float scale, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = ExpFloat(y[i]) * scale;
}
void ScaledExp(const double* y, double scale, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(y[i]) * scale;
}

namespace {

// The distinct classes of l' (blank first) and, for each state, its index among them.
struct TargetClasses {
  std::vector<int64_t> classes;        // [num_distinct]
  std::vector<int64_t> state_to_slot;  // [2U+1]

  explicit TargetClasses(const ExtendedTarget& target) {
    classes = target.state_class;
    std::sort(classes.begin(), classes.end());
    classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
    state_to_slot.resize(target.state_class.size());
    for (size_t s = 0; s < target.state_class.size(); ++s) {
      state_to_slot[s] = std::lower_bound(classes.begin(), classes.end(), target.state_class[s]) - classes.begin();
    }
  }
};

// collected "log+=" value, as torch accumulates it (the first term is assigned, not added to -inf).
template <typename T>
inline void LogAccumulate(T* collected, T value) {
  if (*collected == kNegInf<T>) {
    *collected = value;
    return;
  }
  const T max = std::max(*collected, value);
  *collected = std::log(std::exp(*collected - max) + std::exp(value - max)) + max;
}

// One row of the gradient, t < L:
//   grad(t, c) = (e^{y_t(c)} - e^{collected(c) + nll - y_t(c)}) * grad_loss
// For a finite nll the second term vanishes for the classes outside l' (collected = -inf).
template <typename T>
void WriteGradientRow(const TargetClasses& target_classes, const T* collected, T nll, T grad_loss, const T* y,
                      int64_t num_classes, T* grad) {
  if (std::isfinite(nll)) {
    ScaledExp(y, grad_loss, grad, num_classes);
  } else {
    // -inf + nll is NaN for nll = +inf: torch's NaN gradient of an infinite loss without zero_infinity.
    for (int64_t c = 0; c < num_classes; ++c) {
      grad[c] = (std::exp(y[c]) - std::exp(kNegInf<T> + nll - y[c])) * grad_loss;
    }
  }
  for (size_t slot = 0; slot < target_classes.classes.size(); ++slot) {
    const int64_t c = target_classes.classes[slot];
    grad[c] = (std::exp(y[c]) - std::exp(collected[slot] + nll - y[c])) * grad_loss;
  }
}

template <typename T>
void BackwardSample(const CtcDims& dims, const CtcTargets& targets, int64_t n, const T* grad_loss, const T* log_probs,
                    const T* loss, const T* log_alpha, T* grad_log_probs) {
  const int64_t num_states = dims.NumStates();
  const int64_t num_classes = dims.num_classes;
  const ExtendedTarget target(dims, targets, n);
  const int64_t length = target.input_length;
  const int64_t u = target.target_length;
  // Sample n's block of log_alpha: [max_time, num_states].
  const T* alpha = log_alpha + n * dims.max_time * num_states;
  auto row_offset = [&](int64_t t) { return (t * dims.batch_size + n) * num_classes; };
  auto zero_rows_from = [&](int64_t first) {
    for (int64_t t = first; t < dims.max_time; ++t) {
      std::fill(grad_log_probs + row_offset(t), grad_log_probs + row_offset(t) + num_classes, T(0));
    }
  };
  // zero_infinity: loss holds 0 for an infinite loss, so recompute the loss from log_alpha.
  if (dims.zero_infinity && NegLogLikelihood(target, alpha + std::max<int64_t>(length - 1, 0) * num_states) ==
                                std::numeric_limits<T>::infinity()) {
    zero_rows_from(0);
    return;
  }
  if (length == 0) {
    zero_rows_from(0);
    return;
  }
  const T nll = loss[n];
  const T gradient_scale = grad_loss[n];
  const TargetClasses target_classes(target);
  const int64_t num_slots = static_cast<int64_t>(target_classes.classes.size());
  // log_beta of steps t+1 (next) and t (current): [2U+1] each; collected: [num_slots].
  std::vector<T> next(static_cast<size_t>(target.NumStates()), kNegInf<T>);
  std::vector<T> current(static_cast<size_t>(target.NumStates()), kNegInf<T>);
  std::vector<T> collected(static_cast<size_t>(num_slots), kNegInf<T>);
  auto slot = [&](int64_t s) { return target_classes.state_to_slot[static_cast<size_t>(s)]; };
  auto state_class = [&](int64_t s) { return target.state_class[static_cast<size_t>(s)]; };

  // beta_{L-1}(2U) = y_{L-1}(blank), beta_{L-1}(2U-1) = y_{L-1}(l_U), all else -inf; at L-1 only those
  // two states collect (a blank and a label: two different classes).
  const T* y = log_probs + row_offset(length - 1);
  const T* alpha_row = alpha + (length - 1) * num_states;
  next[static_cast<size_t>(2 * u)] = y[dims.blank];
  collected[static_cast<size_t>(slot(2 * u))] = alpha_row[2 * u] + next[static_cast<size_t>(2 * u)];
  if (u > 0) {
    next[static_cast<size_t>(2 * u - 1)] = y[state_class(2 * u - 1)];
    collected[static_cast<size_t>(slot(2 * u - 1))] = alpha_row[2 * u - 1] + next[static_cast<size_t>(2 * u - 1)];
  }
  WriteGradientRow(target_classes, collected.data(), nll, gradient_scale, y, num_classes,
                   grad_log_probs + row_offset(length - 1));

  for (int64_t t = length - 2; t >= 0; --t) {
    y = log_probs + row_offset(t);
    alpha_row = alpha + t * num_states;
    std::fill(collected.begin(), collected.end(), kNegInf<T>);
    for (int64_t s = 2 * u; s >= 0; --s) {
      // beta_t(s) = log(e^beta_{t+1}(s) + e^beta_{t+1}(s+1) [+ e^beta_{t+1}(s+2) if l'_s != l'_{s+2}]) + y_t(l'_s)
      const T stay = next[static_cast<size_t>(s)];
      const T advance = s < 2 * u ? next[static_cast<size_t>(s + 1)] : kNegInf<T>;
      const T skip =
          s < 2 * u - 1 && state_class(s + 2) != state_class(s) ? next[static_cast<size_t>(s + 2)] : kNegInf<T>;
      current[static_cast<size_t>(s)] = LogSumExp3(stay, advance, skip) + y[state_class(s)];
      // collected(l'_s) log+= alpha_t(s) + beta_t(s)  (eq. 16's sum over the states of one class)
      LogAccumulate(&collected[static_cast<size_t>(slot(s))], alpha_row[s] + current[static_cast<size_t>(s)]);
    }
    std::swap(next, current);
    WriteGradientRow(target_classes, collected.data(), nll, gradient_scale, y, num_classes,
                     grad_log_probs + row_offset(t));
  }
  zero_rows_from(length);
}

}  // namespace

template <typename T>
void CtcBackward(const CtcDims& dims, const CtcTargets& targets, const T* grad_loss, const T* log_probs, const T* loss,
                 const T* log_alpha, T* grad_log_probs, const Executor& executor) {
  executor.For(static_cast<std::size_t>(dims.batch_size), [&](std::size_t n) {
    BackwardSample(dims, targets, static_cast<int64_t>(n), grad_loss, log_probs, loss, log_alpha, grad_log_probs);
  });
}

template void CtcBackward<float>(const CtcDims&, const CtcTargets&, const float*, const float*, const float*,
                                 const float*, float*, const Executor&);
template void CtcBackward<double>(const CtcDims&, const CtcTargets&, const double*, const double*, const double*,
                                  const double*, double*, const Executor&);

}  // namespace ortlstm::ctc
