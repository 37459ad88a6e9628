// Activation functions of the ONNX LSTM (f, g, h): parsing, values and derivatives.
// ORT-free math used by the forward and backward. The backward only has the activated gates, so
// every gate activation also has a derivative written in terms of its *output*.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "lstm/fast_math.h"

namespace ortlstm {

enum class ActivationKind {
  kRelu,
  kTanh,
  kSigmoid,
  kAffine,
  kLeakyRelu,
  kThresholdedRelu,
  kScaledTanh,
  kHardSigmoid,
  kElu,
  kSoftsign,
  kSoftplus,
};

struct Activation {
  ActivationKind kind = ActivationKind::kSigmoid;
  float alpha = 0.0f;
  float beta = 0.0f;
};

// How many of activation_alpha / activation_beta an activation consumes, and the values it uses
// when those lists run short (onnxruntime's defaults).
struct ActivationParamSpec {
  int alpha_count;
  int beta_count;
  float default_alpha;
  float default_beta;
};

// Case-insensitive ONNX name ("Sigmoid", "leakyrelu", ...) -> kind; nullopt if unknown.
std::optional<ActivationKind> ParseActivationName(const std::string& name);
const char* ActivationName(ActivationKind kind);
ActivationParamSpec ActivationParams(ActivationKind kind);

// Whether DerivativeFromOutput is exact for every input: the output must determine the derivative.
// False only for parameter choices that fold two input regions onto one output (LeakyRelu or Elu
// with a negative alpha).
bool DerivativeDeterminedByOutput(const Activation& act);

template <typename T>
inline T Apply(const Activation& act, T x) {
  const T alpha = static_cast<T>(act.alpha);
  const T beta = static_cast<T>(act.beta);
  switch (act.kind) {
    case ActivationKind::kRelu:
      return x > T(0) ? x : (x == x ? T(0) : x);
    case ActivationKind::kTanh:
      return FastTanh(x);
    case ActivationKind::kSigmoid:
      return FastSigmoid(x);
    case ActivationKind::kAffine:
      return alpha * x + beta;
    case ActivationKind::kLeakyRelu:
      return x >= T(0) ? x : alpha * x;
    case ActivationKind::kThresholdedRelu:
      return x > alpha ? x : (x == x ? T(0) : x);
    case ActivationKind::kScaledTanh:
      return alpha * FastTanh(beta * x);
    case ActivationKind::kHardSigmoid: {
      const T y = alpha * x + beta;
      return y != y ? y : std::min(T(1), std::max(T(0), y));
    }
    case ActivationKind::kElu:
      return x >= T(0) ? x : alpha * (std::exp(x) - T(1));
    case ActivationKind::kSoftsign:
      return x / (T(1) + std::abs(x));
    case ActivationKind::kSoftplus:
      // log(1 + e^x) without overflow: max(x, 0) + log1p(e^-|x|).
      return std::max(x, T(0)) + std::log1p(std::exp(-std::abs(x)));
  }
  return x;
}

// d act / d x, from the input x.
template <typename T>
inline T DerivativeFromInput(const Activation& act, T x) {
  const T alpha = static_cast<T>(act.alpha);
  const T beta = static_cast<T>(act.beta);
  switch (act.kind) {
    case ActivationKind::kRelu:
      return x > T(0) ? T(1) : T(0);
    case ActivationKind::kTanh: {
      const T y = FastTanh(x);
      return T(1) - y * y;
    }
    case ActivationKind::kSigmoid: {
      const T y = FastSigmoid(x);
      return y * (T(1) - y);
    }
    case ActivationKind::kAffine:
      return alpha;
    case ActivationKind::kLeakyRelu:
      return x >= T(0) ? T(1) : alpha;
    case ActivationKind::kThresholdedRelu:
      return x > alpha ? T(1) : T(0);
    case ActivationKind::kScaledTanh: {
      const T y = FastTanh(beta * x);
      return alpha * beta * (T(1) - y * y);
    }
    case ActivationKind::kHardSigmoid: {
      const T y = alpha * x + beta;
      return (y > T(0) && y < T(1)) ? alpha : T(0);
    }
    case ActivationKind::kElu:
      return x >= T(0) ? T(1) : alpha * std::exp(x);
    case ActivationKind::kSoftsign: {
      const T d = T(1) + std::abs(x);
      return T(1) / (d * d);
    }
    case ActivationKind::kSoftplus:
      return FastSigmoid(x);
  }
  return T(1);
}

// d act / d x, from the output y = act(x). Exact wherever DerivativeDeterminedByOutput holds
// (at a kink the one-sided value is taken, as the derivative from the input does).
template <typename T>
inline T DerivativeFromOutput(const Activation& act, T y) {
  const T alpha = static_cast<T>(act.alpha);
  const T beta = static_cast<T>(act.beta);
  switch (act.kind) {
    case ActivationKind::kRelu:
      return y > T(0) ? T(1) : T(0);
    case ActivationKind::kTanh:
      return T(1) - y * y;
    case ActivationKind::kSigmoid:
      return y * (T(1) - y);
    case ActivationKind::kAffine:
      return alpha;
    case ActivationKind::kLeakyRelu:
      // alpha >= 0: y >= 0 exactly where x >= 0.
      return y > T(0) || (y == T(0) && alpha != T(0)) ? T(1) : alpha;
    case ActivationKind::kThresholdedRelu:
      return y != T(0) ? T(1) : T(0);
    case ActivationKind::kScaledTanh: {
      if (alpha == T(0)) return T(0);
      const T t = y / alpha;
      return alpha * beta * (T(1) - t * t);
    }
    case ActivationKind::kHardSigmoid:
      return (y > T(0) && y < T(1)) ? alpha : T(0);
    case ActivationKind::kElu:
      // alpha >= 0: y >= 0 exactly where x >= 0, and alpha * e^x = y + alpha below.
      return y >= T(0) ? T(1) : y + alpha;
    case ActivationKind::kSoftsign: {
      const T d = T(1) - std::abs(y);
      return d * d;
    }
    case ActivationKind::kSoftplus:
      // sigmoid(x) = 1 - e^-y, written with expm1 to keep precision for tiny y.
      return -std::expm1(-y);
  }
  return T(1);
}

}  // namespace ortlstm
