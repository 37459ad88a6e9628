// Activation name table: the one place that maps ONNX spellings to kinds and knows how many
// alpha/beta values each consumes and onnxruntime's defaults for them.
#include "lstm/activation.h"

#include <cctype>

namespace ortlstm {
namespace {

struct ActivationEntry {
  const char* lower_name;
  const char* onnx_name;
  ActivationKind kind;
  ActivationParamSpec params;
};

// Defaults are onnxruntime's, odd as some are (Affine and ScaledTanh default to 0, 0, an
// all-zero function); tests/test_reference.py pins them against its LSTM kernel.
constexpr ActivationEntry kActivationTable[] = {
    {"relu", "Relu", ActivationKind::kRelu, {0, 0, 0.0f, 0.0f}},
    {"tanh", "Tanh", ActivationKind::kTanh, {0, 0, 0.0f, 0.0f}},
    {"sigmoid", "Sigmoid", ActivationKind::kSigmoid, {0, 0, 0.0f, 0.0f}},
    {"affine", "Affine", ActivationKind::kAffine, {1, 1, 0.0f, 0.0f}},
    {"leakyrelu", "LeakyRelu", ActivationKind::kLeakyRelu, {1, 0, 0.01f, 0.0f}},
    {"thresholdedrelu", "ThresholdedRelu", ActivationKind::kThresholdedRelu, {1, 0, 0.0f, 0.0f}},
    {"scaledtanh", "ScaledTanh", ActivationKind::kScaledTanh, {1, 1, 0.0f, 0.0f}},
    {"hardsigmoid", "HardSigmoid", ActivationKind::kHardSigmoid, {1, 1, 0.2f, 0.5f}},
    {"elu", "Elu", ActivationKind::kElu, {1, 0, 1.0f, 0.0f}},
    {"softsign", "Softsign", ActivationKind::kSoftsign, {0, 0, 0.0f, 0.0f}},
    {"softplus", "Softplus", ActivationKind::kSoftplus, {0, 0, 0.0f, 0.0f}},
};

const ActivationEntry& EntryOf(ActivationKind kind) {
  for (const auto& entry : kActivationTable) {
    if (entry.kind == kind) return entry;
  }
  return kActivationTable[0];
}

}  // namespace

std::optional<ActivationKind> ParseActivationName(const std::string& name) {
  std::string lower(name);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const auto& entry : kActivationTable) {
    if (lower == entry.lower_name) return entry.kind;
  }
  return std::nullopt;
}

const char* ActivationName(ActivationKind kind) { return EntryOf(kind).onnx_name; }

ActivationParamSpec ActivationParams(ActivationKind kind) { return EntryOf(kind).params; }

bool DerivativeDeterminedByOutput(const Activation& act) {
  switch (act.kind) {
    case ActivationKind::kLeakyRelu:
    case ActivationKind::kElu:
      return act.alpha >= 0.0f;
    default:
      return true;
  }
}

}  // namespace ortlstm
