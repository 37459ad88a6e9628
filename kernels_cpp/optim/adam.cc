// See adam.h. Compiled with -fno-math-errno (CMakeLists.txt) so that sqrt vectorizes; every
// multiply-add that torch fuses is an explicit std::fma (the library builds with
// -ffp-contract=off, so nothing else is contracted). target_clones needs an ELF platform with
// ifunc (glibc); elsewhere the loop is built once for the baseline, where fma may be libm's.
#include "optim/adam.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && !defined(__clang__)
// arch=x86-64-v3: AVX2 with FMA, chosen by CPU features (arch=haswell would be chosen only on
// Haswell itself: GCC dispatches arch= by CPU model except for the x86-64-vN levels).
#define ORTLSTM_ADAM_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define ORTLSTM_ADAM_CLONES
#endif

namespace ortlstm {
namespace {

// Fewest elements worth a task of their own: below this the hand-off costs more than the work.
constexpr int64_t kMinElementsPerTask = 1 << 15;

// std::fma and std::sqrt are functions of the default target, which GCC does not inline into the
// clones; the builtins become single instructions there.
inline __attribute__((always_inline)) float Fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline __attribute__((always_inline)) double Fma(double a, double b, double c) { return __builtin_fma(a, b, c); }
inline __attribute__((always_inline)) float Sqrt(float x) { return __builtin_sqrtf(x); }
inline __attribute__((always_inline)) double Sqrt(double x) { return __builtin_sqrt(x); }

// torch.maximum: NaN if either is NaN.
template <typename T>
inline __attribute__((always_inline)) T MaximumPropagatingNan(T a, T b) {
  return a != a ? a : (a > b ? a : b);
}

// One range of elements. The flags are template parameters so that the loop has no branches.
template <typename T, bool kMaximize, bool kWeightDecay, bool kDecay, bool kAmsgrad, bool kLerpFromStart>
inline __attribute__((always_inline)) void UpdateRange(const AdamScalars<T>& s, const T* __restrict param,
                                                       const T* __restrict grad, const T* __restrict exp_avg,
                                                       const T* __restrict exp_avg_sq,
                                                       const T* __restrict max_exp_avg_sq, T* __restrict param_out,
                                                       T* __restrict exp_avg_out, T* __restrict exp_avg_sq_out,
                                                       T* __restrict max_exp_avg_sq_out, int64_t n) {
  // torch's lerp(start, end, w): start + w * (end - start) for |w| < 0.5, else end - (end - start) * (1 - w),
  // i.e. end + (w - 1) * (end - start), each one fused multiply-add.
  const T lerp_weight = kLerpFromStart ? s.exp_avg_weight : s.exp_avg_weight - T(1);
  for (int64_t i = 0; i < n; ++i) {
    T g = kMaximize ? -grad[i] : grad[i];
    T p = param[i];
    if (kWeightDecay) g = Fma(p, s.weight_decay, g);  // grad.add(param, alpha=weight_decay)
    if (kDecay) p = p * s.decay;                            // param.mul_(1 - lr * weight_decay)
    const T m = exp_avg[i];
    const T m_new = Fma(g - m, lerp_weight, kLerpFromStart ? m : g);
    // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2): ((1 - beta2) * g) * g + beta2 * v
    const T v_new = Fma(s.exp_avg_sq_weight * g, g, exp_avg_sq[i] * s.beta2);
    T second = v_new;
    if (kAmsgrad) {
      second = MaximumPropagatingNan(max_exp_avg_sq[i], v_new);
      max_exp_avg_sq_out[i] = second;
    }
    // denom = (v.sqrt() / bias_correction2_sqrt).add_(eps); param.addcdiv_(exp_avg, denom, value=-step_size),
    // whose CPU kernel computes param + (value * exp_avg) / denom.
    const T denom = Sqrt(second) / s.bias_correction2_sqrt + s.eps;
    param_out[i] = p + (s.neg_step_size * m_new) / denom;
    exp_avg_out[i] = m_new;
    exp_avg_sq_out[i] = v_new;
  }
}

template <typename T, bool kMaximize, bool kWeightDecay, bool kDecay, bool kAmsgrad, bool kLerpFromStart>
ORTLSTM_ADAM_CLONES void UpdateRangeCloned(const AdamScalars<T>& s, const AdamTensors<T>& t, int64_t begin,
                                           int64_t end) {
  auto at = [begin](auto* pointer) { return pointer == nullptr ? pointer : pointer + begin; };
  UpdateRange<T, kMaximize, kWeightDecay, kDecay, kAmsgrad, kLerpFromStart>(
      s, at(t.param), at(t.grad), at(t.exp_avg), at(t.exp_avg_sq), at(t.max_exp_avg_sq), at(t.param_out),
      at(t.exp_avg_out), at(t.exp_avg_sq_out), at(t.max_exp_avg_sq_out), end - begin);
}

template <typename T>
using RangeFunction = void (*)(const AdamScalars<T>&, const AdamTensors<T>&, int64_t, int64_t);

// The instantiation for the flags, chosen once per call.
template <typename T, bool... kFlags>
RangeFunction<T> Select(const bool* flags, int remaining) {
  if constexpr (sizeof...(kFlags) == 5) {
    (void)flags;
    (void)remaining;
    return &UpdateRangeCloned<T, kFlags...>;
  } else {
    return *flags ? Select<T, kFlags..., true>(flags + 1, remaining - 1)
                  : Select<T, kFlags..., false>(flags + 1, remaining - 1);
  }
}

}  // namespace

template <typename T>
AdamScalars<T> AdamScalarsFor(const AdamHyperparameters& h) {
  // Python's float ** float is C's pow; torch: bias_correction2 ** 0.5, not sqrt.
  const double bias_correction1 = 1.0 - std::pow(h.beta1, h.step);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, h.step);
  AdamScalars<T> s;
  s.neg_step_size = static_cast<T>(-(h.lr / bias_correction1));
  s.bias_correction2_sqrt = static_cast<T>(std::pow(bias_correction2, 0.5));
  s.exp_avg_weight = static_cast<T>(1.0 - h.beta1);
  s.beta2 = static_cast<T>(h.beta2);
  s.exp_avg_sq_weight = static_cast<T>(1.0 - h.beta2);
  s.eps = static_cast<T>(h.eps);
  if (h.weight_decay != 0.0) {
    if (h.decoupled_weight_decay) {
      s.has_decay = true;
      s.decay = static_cast<T>(1.0 - h.lr * h.weight_decay);
    } else {
      s.has_weight_decay = true;
      s.weight_decay = static_cast<T>(h.weight_decay);
    }
  }
  s.maximize = h.maximize;
  return s;
}

template <typename T>
void AdamUpdate(const AdamScalars<T>& scalars, const AdamTensors<T>& tensors, const Executor& executor) {
  if (tensors.count <= 0) return;
  const bool flags[5] = {scalars.maximize, scalars.has_weight_decay, scalars.has_decay,
                         tensors.max_exp_avg_sq != nullptr, std::abs(scalars.exp_avg_weight) < T(0.5)};
  const RangeFunction<T> update = Select<T>(flags, 5);
  const int64_t by_size = (tensors.count + kMinElementsPerTask - 1) / kMinElementsPerTask;
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(executor.Width(), by_size));
  executor.For(static_cast<std::size_t>(tasks), [&](std::size_t task) {
    const Range range = SplitRange(tensors.count, tasks, static_cast<int64_t>(task));
    update(scalars, tensors, range.begin, range.end);
  });
}

template AdamScalars<float> AdamScalarsFor<float>(const AdamHyperparameters&);
template AdamScalars<double> AdamScalarsFor<double>(const AdamHyperparameters&);
template void AdamUpdate<float>(const AdamScalars<float>&, const AdamTensors<float>&, const Executor&);
template void AdamUpdate<double>(const AdamScalars<double>&, const AdamTensors<double>&, const Executor&);

}  // namespace ortlstm
