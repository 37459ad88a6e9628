// LSTM attributes, parsed and checked once when a kernel is created. ORT-free: the adapter in
// ort/ reads the raw attribute values from the node and hands them to ParseLstmConfig.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/bf16_gemm.h"
#include "lstm/activation.h"

namespace ortlstm {

enum class Direction { kForward, kReverse, kBidirectional };

// The attribute values exactly as the node carries them; nullopt = attribute absent.
struct RawLstmAttributes {
  std::optional<int64_t> hidden_size;
  std::optional<std::string> direction;
  std::optional<std::vector<std::string>> activations;
  // Which attribute the activation names came from, for messages: "activations" or the
  // comma-separated "activations_csv" that older runtimes need.
  std::string activations_attribute = "activations";
  std::optional<std::vector<float>> activation_alpha;
  std::optional<std::vector<float>> activation_beta;
  std::optional<float> clip;
  std::optional<int64_t> input_forget;
  std::optional<int64_t> layout;
  std::optional<std::string> matmul_precision;
};

// Activations of one direction, in ONNX order: f (gates i, o, f), g (cell candidate), h (output).
struct DirectionActivations {
  Activation f;
  Activation g;
  Activation h;
};

struct LstmConfig {
  int64_t hidden_size = 0;
  Direction direction = Direction::kForward;
  int64_t num_directions = 1;
  std::array<DirectionActivations, 2> activations{};  // [num_directions] used
  std::optional<float> clip;                          // absent: no clipping
  bool input_forget = false;
  int64_t layout = 0;
  MatmulPrecision matmul_precision = MatmulPrecision::kFloat32;  // of every GEMM (common/bf16_gemm.h)

  // Processing direction of direction slot d (0 or 1): reverse runs t = seq_length-1 .. 0.
  bool IsReverse(int64_t d) const {
    return direction == Direction::kReverse || (direction == Direction::kBidirectional && d == 1);
  }
};

// Fills *config from raw attributes; returns "" on success or a message naming the attribute and
// the expected vs actual value.
// The op's matmul_precision (overloaded for each cell's config, so generic adapters can read it).
inline MatmulPrecision MatmulPrecisionOf(const LstmConfig& config) { return config.matmul_precision; }

std::string ParseLstmConfig(const RawLstmAttributes& raw, LstmConfig* config);

// The same for a recurrent cell with `activation_count` activations per direction (3 for the
// LSTM: f, g, h; 2 for the GRU: f, g, which fill DirectionActivations' f and g). input_forget is
// the LSTM's alone: a cell without it leaves raw.input_forget unset.
std::string ParseRecurrentConfig(const RawLstmAttributes& raw, int activation_count, LstmConfig* config);

// The activation names of a config, joined by commas in ONNX spelling (for messages and the
// companion string attribute).
std::string JoinActivationNames(const LstmConfig& config);

}  // namespace ortlstm
