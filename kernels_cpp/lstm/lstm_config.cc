// Attribute parsing for both ops: every attribute is checked here once, with messages that name
// the attribute and the expected vs actual value.
#include "lstm/lstm_config.h"

#include <cmath>
#include <sstream>

#include "generated/op_schema.h"

namespace ortlstm {
namespace {

std::string JoinStrings(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += items[i];
  }
  return out;
}

}  // namespace

std::string ParseLstmConfig(const RawLstmAttributes& raw, LstmConfig* config) {
  return ParseRecurrentConfig(raw, 3, config);
}

std::string ParseRecurrentConfig(const RawLstmAttributes& raw, int activation_count, LstmConfig* config) {
  namespace attr = schema::attr;
  LstmConfig cfg;
  if (!raw.hidden_size) return "attribute hidden_size is required (a positive integer) but is missing";
  // 8*hidden_size (B's width) must stay an int for BLAS.
  if (*raw.hidden_size <= 0 || *raw.hidden_size > schema::limits::kMaxHiddenSize) {
    return std::string("attribute hidden_size: expected ") + attr::kHiddenSizeAccepts + ", got " +
           std::to_string(*raw.hidden_size);
  }
  cfg.hidden_size = *raw.hidden_size;

  const std::string direction = raw.direction.value_or("forward");
  if (direction == "forward") {
    cfg.direction = Direction::kForward;
  } else if (direction == "reverse") {
    cfg.direction = Direction::kReverse;
  } else if (direction == "bidirectional") {
    cfg.direction = Direction::kBidirectional;
  } else {
    return std::string("attribute direction: expected ") + attr::kDirectionAccepts + ", got '" + direction + "'";
  }
  cfg.num_directions = cfg.direction == Direction::kBidirectional ? 2 : 1;

  const std::vector<std::string> defaults = {"Sigmoid", "Tanh", "Tanh"};
  const auto per_direction = static_cast<size_t>(activation_count);
  std::vector<std::string> names;
  if (raw.activations && !raw.activations->empty()) {
    names = *raw.activations;
  } else {
    for (int64_t d = 0; d < cfg.num_directions; ++d) {
      names.insert(names.end(), defaults.begin(), defaults.begin() + activation_count);
    }
  }
  const size_t expected_count = per_direction * static_cast<size_t>(cfg.num_directions);
  if (names.size() != expected_count) {
    std::ostringstream msg;
    msg << "attribute " << raw.activations_attribute << ": expected " << activation_count
        << "*num_directions=" << expected_count << " names (" << (activation_count == 3 ? "f, g, h" : "f, g") << " per direction, "
        << "direction=" << direction << "), got " << names.size() << " [" << JoinStrings(names) << "]";
    return msg.str();
  }
  const std::vector<float> alphas = raw.activation_alpha.value_or(std::vector<float>{});
  const std::vector<float> betas = raw.activation_beta.value_or(std::vector<float>{});
  size_t next_alpha = 0;
  size_t next_beta = 0;
  std::array<Activation, 6> parsed{};
  for (size_t k = 0; k < names.size(); ++k) {
    const auto kind = ParseActivationName(names[k]);
    if (!kind) {
      return "attribute " + raw.activations_attribute + ": unknown activation '" + names[k] + "' at position " + std::to_string(k) +
             "; expected one of Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, "
             "Elu, Softsign, Softplus";
    }
    const ActivationParamSpec spec = ActivationParams(*kind);
    Activation act{*kind, spec.default_alpha, spec.default_beta};
    if (spec.alpha_count > 0 && next_alpha < alphas.size()) act.alpha = alphas[next_alpha++];
    if (spec.beta_count > 0 && next_beta < betas.size()) act.beta = betas[next_beta++];
    parsed[k] = act;
  }
  // Values past those the activations take are ignored, as onnxruntime's LSTM does: exporters write
  // one alpha and one beta per activation, whether it reads them or not.
  for (int64_t d = 0; d < cfg.num_directions; ++d) {
    const size_t first = per_direction * static_cast<size_t>(d);
    cfg.activations[d] = DirectionActivations{parsed[first], parsed[first + 1],
                                              activation_count == 3 ? parsed[first + 2] : Activation{}};
  }

  if (raw.clip) {
    if (!(*raw.clip > 0.0f)) {
      return std::string("attribute clip: expected ") + attr::kClipAccepts + ", got " + std::to_string(*raw.clip);
    }
    if (!std::isinf(*raw.clip)) cfg.clip = *raw.clip;  // +inf clips nothing, as in onnxruntime's LSTM
  }
  // Any nonzero value couples the gates, as in onnxruntime's LSTM.
  cfg.input_forget = raw.input_forget.value_or(0) != 0;
  cfg.layout = raw.layout.value_or(0);
  if (cfg.layout != 0 && cfg.layout != 1) {
    return std::string("attribute layout: expected ") + attr::kLayoutAccepts + ", got " + std::to_string(cfg.layout);
  }
  if (std::string error = ParseMatmulPrecision(raw.matmul_precision.value_or(attr::kMatmulPrecisionDefault),
                                               &cfg.matmul_precision);
      !error.empty()) {
    return error;
  }
  *config = cfg;
  return "";
}

std::string JoinActivationNames(const LstmConfig& config) {
  std::string out;
  for (int64_t d = 0; d < config.num_directions; ++d) {
    const auto& acts = config.activations[d];
    for (const Activation* act : {&acts.f, &acts.g, &acts.h}) {
      if (!out.empty()) out += ",";
      out += ActivationName(act->kind);
    }
  }
  return out;
}

}  // namespace ortlstm
