// What the optimizer kernels (adam.cc, sgd.cc) share: the CPU clones of their loops, fused
// multiply-adds as single instructions inside them, one loop instance per combination of flags
// chosen once per call, and the split of the elements over the executor's tasks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/parallel.h"

// arch=x86-64-v3: AVX2 with FMA, chosen by CPU features (arch=haswell would be chosen only on
// Haswell itself: GCC dispatches arch= by CPU model except for the x86-64-vN levels).
// target_clones needs an ELF platform with ifunc (glibc); elsewhere the loop is built once for the
// baseline, where fma may be libm's.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && !defined(__clang__)
#define ORTLSTM_OPTIM_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define ORTLSTM_OPTIM_CLONES
#endif

namespace ortlstm::optim {

// std::fma and std::sqrt are functions of the default target, which GCC does not inline into the
// clones; the builtins become single instructions there.
inline __attribute__((always_inline)) float Fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline __attribute__((always_inline)) double Fma(double a, double b, double c) { return __builtin_fma(a, b, c); }
inline __attribute__((always_inline)) float Sqrt(float x) { return __builtin_sqrtf(x); }
inline __attribute__((always_inline)) double Sqrt(double x) { return __builtin_sqrt(x); }

// Instance<kFlags...>::kFunction for the run-time values of `flags` (kCount of them): the loop is
// compiled once per combination, so it has no branches on them. Instance's name must be unique in
// the library, even inside an anonymous namespace: GCC 12 emits this template's specializations
// for a template template argument from an anonymous namespace in COMDAT groups named after it, so
// two translation units' `(anonymous)::Instances` were merged by the linker and SGDUpdate ran
// AdamUpdate's loop (caught by AddressSanitizer in the Debug build, where nothing is inlined).
template <template <bool...> class Instance, int kCount, bool... kFlags>
constexpr auto SelectInstance(const bool* flags) {
  if constexpr (sizeof...(kFlags) == kCount) {
    (void)flags;
    return Instance<kFlags...>::kFunction;
  } else {
    return *flags ? SelectInstance<Instance, kCount, kFlags..., true>(flags + 1)
                  : SelectInstance<Instance, kCount, kFlags..., false>(flags + 1);
  }
}

// Fewest elements worth a task of their own: below this the hand-off costs more than the work.
inline constexpr int64_t kMinElementsPerTask = 1 << 15;

// body(begin, end) over contiguous ranges covering [0, count), one per task. Every element is
// computed the same way whichever task has it, so the result does not depend on the split.
template <typename Body>
void ForElementRanges(int64_t count, const Executor& executor, const Body& body) {
  if (count <= 0) return;
  const int64_t by_size = (count + kMinElementsPerTask - 1) / kMinElementsPerTask;
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(executor.Width(), by_size));
  executor.For(static_cast<std::size_t>(tasks), [&](std::size_t task) {
    const Range range = SplitRange(count, tasks, static_cast<int64_t>(task));
    body(range.begin, range.end);
  });
}

}  // namespace ortlstm::optim
