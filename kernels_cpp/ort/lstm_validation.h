// Runtime checks of every input of LSTMTraining and LSTMGrad (and GRUTraining, GRUGrad), done once per call before any math.
// Each returns "" and fills LstmDims, or a message naming the input with expected vs actual shape,
// type or value (dim names as in docs/ops.md).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "generated/op_schema.h"
#include "lstm/lstm_config.h"
#include "lstm/lstm_dims.h"
#include "ort/ort_util.h"

namespace ortlstm::ort {

using TrainingInputs = std::array<TensorArg, schema::lstm_training::kNumInputs>;
using GradInputs = std::array<TensorArg, schema::lstm_grad::kNumInputs>;
using GruTrainingInputs = std::array<TensorArg, schema::gru_training::kNumInputs>;
using GruGradInputs = std::array<TensorArg, schema::gru_grad::kNumInputs>;
using RnnTrainingInputs = std::array<TensorArg, schema::rnn_training::kNumInputs>;
using RnnGradInputs = std::array<TensorArg, schema::rnn_grad::kNumInputs>;

std::string ValidateTrainingInputs(const LstmConfig& config, const TrainingInputs& inputs, LstmDims* dims);
std::string ValidateGradInputs(const LstmConfig& config, const GradInputs& inputs, LstmDims* dims);
// The GRU ops' inputs, by the same rules with three gates; dims->gates is 3.
std::string ValidateGruTrainingInputs(const LstmConfig& config, const GruTrainingInputs& inputs, LstmDims* dims);
std::string ValidateGruGradInputs(const LstmConfig& config, const GruGradInputs& inputs, LstmDims* dims);
// The RNN ops' inputs, by the same rules with one gate; dims->gates is 1.
std::string ValidateRnnTrainingInputs(const LstmConfig& config, const RnnTrainingInputs& inputs, LstmDims* dims);
std::string ValidateRnnGradInputs(const LstmConfig& config, const RnnGradInputs& inputs, LstmDims* dims);

// A gradient op (LSTMGrad, GRUGrad) derives gate derivatives from the stashed activated gates,
// which needs activations (f and g of every direction) whose output determines the derivative;
// "" or a message naming the attribute and the value to use.
std::string CheckGradientActivations(const LstmConfig& config, const char* op_name);

// Output shapes, from validated dims.
std::vector<int64_t> SequenceShape(const LstmDims& dims, int64_t width);  // HAll, CAll (H), IOFC (4H)
std::vector<int64_t> StateShape(const LstmDims& dims);                    // Ht, Ct, initial_h, dH0, ...
std::vector<int64_t> InputShape(const LstmDims& dims);                    // X, dX
std::array<std::vector<int64_t>, 3> WeightShapes(const LstmDims& dims);   // W, R, B (dW, dR, dB)

}  // namespace ortlstm::ort
