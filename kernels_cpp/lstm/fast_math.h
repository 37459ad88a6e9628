// exp, sigmoid and tanh written so that GCC vectorizes loops over them: branch-free, only
// +, -, *, / and bit moves, no libm call. The float versions carry the forward and backward
// pointwise passes (libm's scalar expf/tanhf would cost more than the GEMMs at common sizes);
// double keeps libm, whose precision gradient checks in float64 rely on.
//
// The build turns off floating-point contraction (-ffp-contract=off; standard_cell.cc alone has
// it on), so a value computed inside a vectorized loop is bit-identical to the same call made
// alone. The backward relies on that to recognise clipped gates (lstm/gate_math.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace ortlstm {

// e^x for float, with relative error within a few ulp on the whole range: x = n*ln2 + r with
// |r| <= ln2/2 (ln2 split in two so n*ln2_hi is exact), e^r by its Taylor polynomial to r^7
// (the first dropped term is below 6e-9 relative), and 2^n assembled in the exponent bits.
// Overflows to +inf, underflows to 0 (no denormal results), NaN stays NaN.
inline float ExpFloat(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // few mantissa bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr float kMaxInput = 88.0f;  // n <= 127: 2^n stays a normal float
  constexpr float kMinInput = -87.3365447505531f;  // n >= -126
  const bool overflow = x > kMaxInput;
  const bool underflow = x < kMinInput;
  const float clamped = x > kMaxInput ? kMaxInput : (x < kMinInput ? kMinInput : x);
  const float shifted = clamped * kLog2e + kRoundMagic;
  const float n = shifted - kRoundMagic;
  const float r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // The integer n sits in the low bits of `shifted`; 2^n is (n + 127) in the exponent field.
  // Unsigned arithmetic: for a NaN input the bits are garbage (the result is discarded below),
  // and wrapping must not be undefined behaviour.
  uint32_t shifted_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
  const uint32_t scale_bits = (shifted_bits - 0x4B400000u + 127u) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof(scale));
  const float result = p * scale;
  const float bounded = overflow ? HUGE_VALF : (underflow ? 0.0f : result);
  return x != x ? x : bounded;
}

inline float SigmoidFloat(float x) { return 1.0f / (1.0f + ExpFloat(-x)); }

// tanh(x) = sign(x) * (1 - e) / (1 + e) with e = e^(-2|x|): absolute error within a few ulp of 1,
// which is what an LSTM gate needs (relative error grows only for |x| below ~1e-3).
inline float TanhFloat(float x) {
  const float e = ExpFloat(-2.0f * std::fabs(x));
  const float magnitude = (1.0f - e) / (1.0f + e);
  return x < 0.0f ? -magnitude : (x != x ? x : magnitude);
}

template <typename T>
inline T FastExp(T x) {
  return std::exp(x);
}
template <>
inline float FastExp<float>(float x) {
  return ExpFloat(x);
}

template <typename T>
inline T FastSigmoid(T x) {
  // Written so that neither branch overflows: exp of a non-positive argument only.
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}
template <>
inline float FastSigmoid<float>(float x) {
  return SigmoidFloat(x);
}

template <typename T>
inline T FastTanh(T x) {
  return std::tanh(x);
}
template <>
inline float FastTanh<float>(float x) {
  return TanhFloat(x);
}

}  // namespace ortlstm
