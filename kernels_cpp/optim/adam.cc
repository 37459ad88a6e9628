// See adam.h. Compiled with -fno-math-errno (CMakeLists.txt) so that sqrt vectorizes; every
// multiply-add that torch fuses is an explicit fused multiply-add (the library builds with
// -ffp-contract=off, so nothing else is contracted); clones and task split: optim/elementwise.h.
#include "optim/adam.h"

#include <cmath>

#include "optim/elementwise.h"

namespace ortlstm {
namespace {

using optim::Fma;
using optim::Sqrt;

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
ORTLSTM_OPTIM_CLONES void UpdateRangeCloned(const AdamScalars<T>& s, const AdamTensors<T>& t, int64_t begin,
                                            int64_t end) {
  auto at = [begin](auto* pointer) { return pointer == nullptr ? pointer : pointer + begin; };
  UpdateRange<T, kMaximize, kWeightDecay, kDecay, kAmsgrad, kLerpFromStart>(
      s, at(t.param), at(t.grad), at(t.exp_avg), at(t.exp_avg_sq), at(t.max_exp_avg_sq), at(t.param_out),
      at(t.exp_avg_out), at(t.exp_avg_sq_out), at(t.max_exp_avg_sq_out), end - begin);
}

template <typename T>
struct AdamInstances {
  template <bool... kFlags>
  struct Of {
    static constexpr auto kFunction = &UpdateRangeCloned<T, kFlags...>;
  };
};

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
  const bool flags[5] = {scalars.maximize, scalars.has_weight_decay, scalars.has_decay,
                         tensors.max_exp_avg_sq != nullptr, std::abs(scalars.exp_avg_weight) < T(0.5)};
  const auto update = optim::SelectInstance<AdamInstances<T>::template Of, 5>(flags);
  optim::ForElementRanges(tensors.count, executor,
                          [&](int64_t begin, int64_t end) { update(scalars, tensors, begin, end); });
}

template AdamScalars<float> AdamScalarsFor<float>(const AdamHyperparameters&);
template AdamScalars<double> AdamScalarsFor<double>(const AdamHyperparameters&);
template void AdamUpdate<float>(const AdamScalars<float>&, const AdamTensors<float>&, const Executor&);
template void AdamUpdate<double>(const AdamScalars<double>&, const AdamTensors<double>&, const Executor&);

}  // namespace ortlstm
