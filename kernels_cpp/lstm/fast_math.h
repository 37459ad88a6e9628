// exp, sigmoid and tanh written so that GCC vectorizes loops over them: branch-free, only
// +, -, *, / and bit moves, no libm call. The float versions carry the forward and backward
// pointwise passes (libm's scalar expf/tanhf would cost more than the GEMMs at common sizes);
// the double sigmoid and tanh carry the fused cells of float64 LSTMs (standard_cell.cc), within
// a few ulp of libm's. The general path in double (other activations, clip, peepholes) keeps
// libm through FastSigmoid / FastTanh.
//
// The build turns off floating-point contraction (-ffp-contract=off; standard_cell.cc alone has
// it on), so a value computed inside a vectorized loop is bit-identical to the same call made
// alone. The backward relies on that to recognise clipped gates (lstm/gate_math.h).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ortlstm {

namespace fast_math_detail {

constexpr float kExpMinInput = -87.3365447505531f;  // e^x >= 2^-126: the smallest normal float
constexpr float kExpMaxInput = 88.0f;  // e^x < 2^127
constexpr double kExpMinInputDouble = -708.3964185322641;  // e^x >= 2^-1022: the smallest normal

// The constants of ExpNoRangeCheck per type: ln2 split in two so that n * kLn2Hi is exact, the
// rounding magic 1.5 * 2^mantissa_bits (adding it rounds to an integer, which then sits in the low
// bits), the exponent bias, and the Taylor coefficients of e^r from the highest power down: to
// r^7 for float (the first dropped term is below 6e-9 relative), r^13 for double (below 5e-18).
template <typename T>
struct ExpConstants;

template <>
struct ExpConstants<float> {
  using Bits = uint32_t;
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kLn2Hi = 0.693359375f;  // few mantissa bits
  static constexpr float kLn2Lo = -2.12194440e-4f;
  static constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23
  static constexpr Bits kRoundMagicBits = 0x4B400000u;
  static constexpr Bits kExponentBias = 127u;
  static constexpr int kMantissaBits = 23;
  static constexpr float kCoefficients[] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                            1.0f / 6.0f,    0.5f,          1.0f,          1.0f};
};

template <>
struct ExpConstants<double> {
  using Bits = uint64_t;
  static constexpr double kLog2e = 1.4426950408889634;
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;  // low 21 mantissa bits zero
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kRoundMagic = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr Bits kRoundMagicBits = 0x4338000000000000ull;
  static constexpr Bits kExponentBias = 1023u;
  static constexpr int kMantissaBits = 52;
  static constexpr double kCoefficients[] = {
      1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
      1.0 / 40320.0,      1.0 / 5040.0,      1.0 / 720.0,      1.0 / 120.0,     1.0 / 24.0,
      1.0 / 6.0,          0.5,               1.0,              1.0};  // 1/13! .. 1/0!
};

// e^x without range handling: x = n*ln2 + r with |r| <= ln2/2, e^r by its Taylor polynomial, and
// 2^n assembled in the exponent bits. Exact to a few ulp while 2^n is a normal number: for float
// x in [kExpMinInput, 88.72] (n in [-126, 127]), for double [kExpMinInputDouble, 709.43]. One
// step further (float up to 89, double up to 710) n is the bias + 1, whose all-ones exponent field
// makes 2^n +inf, so the result is +inf as it should be. Beyond that the bits are garbage; a NaN
// gives NaN.
template <typename T>
inline T ExpNoRangeCheck(T x) {
  using C = ExpConstants<T>;
  const T shifted = x * C::kLog2e + C::kRoundMagic;
  const T n = shifted - C::kRoundMagic;
  const T r = (x - n * C::kLn2Hi) - n * C::kLn2Lo;
  T p = C::kCoefficients[0];
  for (size_t i = 1; i < sizeof(C::kCoefficients) / sizeof(T); ++i) p = p * r + C::kCoefficients[i];
  // The integer n sits in the low bits of `shifted`; 2^n is (n + bias) in the exponent field.
  // Unsigned arithmetic: for a NaN input the bits are garbage (the product is NaN anyway), and
  // wrapping must not be undefined behaviour.
  typename C::Bits shifted_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
  const typename C::Bits scale_bits = (shifted_bits - C::kRoundMagicBits + C::kExponentBias) << C::kMantissaBits;
  T scale;
  std::memcpy(&scale, &scale_bits, sizeof(scale));
  return p * scale;
}

// x limited to [lo, hi]; a NaN passes through (both comparisons are false).
template <typename T>
inline T Clamp(T x, T lo, T hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

}  // namespace fast_math_detail

// e^x for float, with relative error within a few ulp on the whole range. Overflows to +inf,
// underflows to 0 (no denormal results), NaN stays NaN.
inline float ExpFloat(float x) {
  using namespace fast_math_detail;
  const float result = ExpNoRangeCheck(Clamp(x, kExpMinInput, kExpMaxInput));
  const float bounded = x > kExpMaxInput ? HUGE_VALF : (x < kExpMinInput ? 0.0f : result);
  return x != x ? x : bounded;
}

// The gate activations need no range selects: below kExpMinInput e^x is replaced by 2^-126,
// which leaves 1 + e^x and 1 - e^x at exactly 1, and up to 89 the exponential overflows to +inf
// by itself, which makes 1 / (1 + e^x) exactly 0. Without the selects the vectorized loops of the
// cells are about a third faster.
inline float SigmoidFloat(float x) {
  using namespace fast_math_detail;
  return 1.0f / (1.0f + ExpNoRangeCheck(Clamp(-x, kExpMinInput, 89.0f)));
}

// tanh(x) = sign(x) * (1 - e) / (1 + e) with e = e^(-2|x|): absolute error within a few ulp of 1,
// which is what an LSTM gate needs (relative error grows only for |x| below ~1e-3). NaN stays NaN.
inline float TanhFloat(float x) {
  using namespace fast_math_detail;
  const float e = ExpNoRangeCheck(Clamp(-2.0f * std::fabs(x), kExpMinInput, 0.0f));
  return std::copysign((1.0f - e) / (1.0f + e), x);
}

namespace fast_math_detail {

// e^x - 1 for x in [-0.5, 0], by its Taylor polynomial to x^16 (the first dropped term is below
// 2e-19 relative): no cancellation, so tanh of a small argument keeps its relative precision.
inline double Expm1SmallDouble(double x) {
  constexpr double kInverseFactorials[] = {
      1.0 / 355687428096000.0, 1.0 / 20922789888000.0, 1.0 / 1307674368000.0, 1.0 / 87178291200.0,
      1.0 / 6227020800.0,      1.0 / 479001600.0,      1.0 / 39916800.0,      1.0 / 3628800.0,
      1.0 / 362880.0,          1.0 / 40320.0,          1.0 / 5040.0,          1.0 / 720.0,
      1.0 / 120.0,             1.0 / 24.0,             1.0 / 6.0,             0.5,
      1.0};  // 1/17! .. 1/1!
  double p = kInverseFactorials[0];
  for (int i = 1; i < 17; ++i) p = p * x + kInverseFactorials[i];
  return p * x;
}

}  // namespace fast_math_detail

// As SigmoidFloat, in double: no range selects, exactly 0 and 1 far out.
inline double SigmoidDouble(double x) {
  using namespace fast_math_detail;
  return 1.0 / (1.0 + ExpNoRangeCheck(Clamp(-x, kExpMinInputDouble, 710.0)));
}

// tanh(|x|) = (1 - e) / (1 + e) with e = e^(-2|x|), or for |x| < 1/4, where 1 - e would lose
// relative precision, -m / (2 + m) with m = e^(-2|x|) - 1 from its own series. Both are computed
// and one is selected, which keeps the loops branch-free. NaN stays NaN.
inline double TanhDouble(double x) {
  using namespace fast_math_detail;
  const double a = std::fabs(x);
  const double e = ExpNoRangeCheck(Clamp(-2.0 * a, kExpMinInputDouble, 0.0));
  const double large = (1.0 - e) / (1.0 + e);
  const double m = Expm1SmallDouble(Clamp(-2.0 * a, -0.5, 0.0));
  const double small = -m / (2.0 + m);
  return std::copysign(a < 0.25 ? small : large, x);
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
