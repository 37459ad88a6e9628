// See sgd.h. Every multiply-add that torch fuses is an explicit fused multiply-add (the library
// builds with -ffp-contract=off, so nothing else is contracted); clones and task split:
// optim/elementwise.h.
#include "optim/sgd.h"

#include "optim/elementwise.h"

namespace ortlstm {
namespace {

using optim::Fma;

// One range of elements. The flags are template parameters so that the loop has no branches.
template <typename T, bool kMaximize, bool kWeightDecay, bool kMomentum, bool kFirstStep, bool kNesterov>
inline __attribute__((always_inline)) void UpdateRange(const SgdScalars<T>& s, const T* __restrict param,
                                                       const T* __restrict grad, const T* __restrict buffer,
                                                       T* __restrict param_out, T* __restrict buffer_out,
                                                       int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T p = param[i];
    T g = kMaximize ? -grad[i] : grad[i];
    if (kWeightDecay) g = Fma(p, s.weight_decay, g);  // grad.add(param, alpha=weight_decay)
    if (kMomentum) {
      // torch: buf = clone(grad) at the first step, else buf.mul_(momentum).add_(grad, alpha=1 - dampening).
      const T b = kFirstStep ? g : Fma(g, s.one_minus_dampening, buffer[i] * s.momentum);
      buffer_out[i] = b;
      g = kNesterov ? Fma(b, s.momentum, g) : b;  // grad.add(buf, alpha=momentum), or buf
    }
    param_out[i] = Fma(g, s.neg_lr, p);  // param.add_(grad, alpha=-lr)
  }
}

template <typename T, bool kMaximize, bool kWeightDecay, bool kMomentum, bool kFirstStep, bool kNesterov>
ORTLSTM_OPTIM_CLONES void UpdateRangeCloned(const SgdScalars<T>& s, const SgdTensors<T>& t, int64_t begin,
                                           int64_t end) {
  auto at = [begin](auto* pointer) { return pointer == nullptr ? pointer : pointer + begin; };
  UpdateRange<T, kMaximize, kWeightDecay, kMomentum, kFirstStep, kNesterov>(
      s, at(t.param), at(t.grad), at(t.momentum_buffer), at(t.param_out), at(t.momentum_buffer_out), end - begin);
}

template <typename T>
struct SgdInstances {
  template <bool... kFlags>
  struct Of {
    static constexpr auto kFunction = &UpdateRangeCloned<T, kFlags...>;
  };
};

}  // namespace

template <typename T>
SgdScalars<T> SgdScalarsFor(const SgdHyperparameters& h) {
  SgdScalars<T> s;
  s.neg_lr = static_cast<T>(-h.lr);
  if (h.weight_decay != 0.0) {
    s.has_weight_decay = true;
    s.weight_decay = static_cast<T>(h.weight_decay);
  }
  s.momentum = static_cast<T>(h.momentum);
  s.one_minus_dampening = static_cast<T>(1.0 - h.dampening);
  s.first_step = h.step == 1.0;
  s.nesterov = h.nesterov;
  s.maximize = h.maximize;
  return s;
}

template <typename T>
void SgdUpdate(const SgdScalars<T>& scalars, const SgdTensors<T>& tensors, const Executor& executor) {
  const bool momentum = tensors.momentum_buffer != nullptr;
  const bool flags[5] = {scalars.maximize, scalars.has_weight_decay, momentum, momentum && scalars.first_step,
                         momentum && scalars.nesterov};
  const auto update = optim::SelectInstance<SgdInstances<T>::template Of, 5>(flags);
  optim::ForElementRanges(tensors.count, executor,
                          [&](int64_t begin, int64_t end) { update(scalars, tensors, begin, end); });
}

template SgdScalars<float> SgdScalarsFor<float>(const SgdHyperparameters&);
template SgdScalars<double> SgdScalarsFor<double>(const SgdHyperparameters&);
template void SgdUpdate<float>(const SgdScalars<float>&, const SgdTensors<float>&, const Executor&);
template void SgdUpdate<double>(const SgdScalars<double>&, const SgdTensors<double>&, const Executor&);

}  // namespace ortlstm
