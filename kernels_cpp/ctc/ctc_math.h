// Pieces the CTC forward and backward share: the extended target l' of one sample and the
// logsumexp steps of the recursions, written as torch's _ctc_loss writes them (the same operations
// in the same order, so float64 results match torch's bit for bit on the same libm).
// Layout of every buffer: ctc/ctc_loss.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ctc/ctc_loss.h"

namespace ortlstm::ctc {

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// l' = (blank, l_1, blank, ..., l_U, blank) of sample n, with for each state s its class and
// whether the recursion may skip from s-2 to s (l'_s != l'_{s-2}, i.e. s odd and l_{s/2} differs
// from the label before it).
struct ExtendedTarget {
  int64_t input_length = 0;
  int64_t target_length = 0;         // U; the states are 0 .. 2U
  std::vector<int64_t> state_class;  // [2U+1]
  std::vector<char> can_skip;        // [2U+1]

  ExtendedTarget(const CtcDims& dims, const CtcTargets& targets, int64_t n)
      : input_length(targets.input_lengths[n]), target_length(targets.target_lengths[n]) {
    const int64_t* label = targets.labels + targets.label_offsets[n];
    const int64_t num_states = 2 * target_length + 1;
    state_class.assign(static_cast<size_t>(num_states), dims.blank);
    can_skip.assign(static_cast<size_t>(num_states), 0);
    for (int64_t s = 1; s < num_states; s += 2) {
      state_class[static_cast<size_t>(s)] = label[s / 2];
      can_skip[static_cast<size_t>(s)] = s > 1 && label[s / 2] != label[s / 2 - 1];
    }
  }
  int64_t NumStates() const { return 2 * target_length + 1; }
};

// log(e^a + e^b + e^c), the maximum taken out first (0 when all three are -inf, so that no
// -inf - -inf appears): the step of eqs. (6) and (10).
template <typename T>
inline T LogSumExp3(T a, T b, T c) {
  T max = a;
  if (b > max) max = b;
  if (c > max) max = c;
  if (max == kNegInf<T>) max = 0;
  return std::log(std::exp(a - max) + std::exp(b - max) + std::exp(c - max)) + max;
}

// The loss from the last row of log_alpha (eq. 8): -log(alpha[L-1, 2U] + alpha[L-1, 2U-1]), only
// the first term for U = 0; with L = 0, 0 for U = 0 and +inf otherwise. Before zero_infinity.
template <typename T>
inline T NegLogLikelihood(const ExtendedTarget& target, const T* alpha_last_row) {
  const int64_t u = target.target_length;
  if (target.input_length == 0) {
    const T log_likelihood = u == 0 ? T(0) : kNegInf<T>;
    return -log_likelihood;
  }
  if (u == 0) return -alpha_last_row[0];
  const T l1 = alpha_last_row[2 * u];
  const T l2 = alpha_last_row[2 * u - 1];
  T max = std::max(l1, l2);
  max = max == kNegInf<T> ? T(0) : max;
  return -(std::log(std::exp(l1 - max) + std::exp(l2 - max)) + max);
}

}  // namespace ortlstm::ctc
