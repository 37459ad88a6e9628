// RNN forward for RNNTraining: the recurrent family's third cell policy (RnnForwardCell) on the
// shared time loop (recurrent/forward_driver.h), which projects X for all steps (X W^T), adds each
// step's H_{t-1} R^T into that step's rows (one gate, one stage, accumulated) and cuts the loop
// into tasks as it does the LSTM's and GRU's (groups of batch entries, or blocks of hidden units),
// the two directions in parallel. The cell adds the biases and runs rnn/rnn_cell.h on each block.
// Layouts: lstm/lstm_dims.h (gates = 1).
//
//   H_t = f(clip(X_t W^T + H_{t-1} R^T + Wb + Rb))
//
// An entry past its sequence length passes its state through and its output of that step is zero
// (as the LSTM's and GRU's are); the RNN has no state or stash of its own.
#include <memory>

#include "recurrent/forward_driver.h"
#include "rnn/rnn_cell.h"
#include "rnn/rnn_math.h"

namespace ortlstm {
namespace {

template <typename T>
class RnnForwardCell {
 public:
  static constexpr int64_t kGates = 1;
  static constexpr bool kAccumulate = true;  // H_{t-1} R^T adds straight into the projected rows

  // With one gate the block-major order is the unit order, so the biases need no permutation.
  RnnForwardCell(const LstmDims& dims, const LstmConfig& config, const RnnForwardTensors<T>& io, int64_t d,
                 const ScratchAllocator& allocator)
      : cell_(config.activations[d].f, config.clip), bias_(allocator, io.B ? dims.hidden_size : 0) {
    if (!io.B) return;
    const T* wb = io.B + d * 2 * dims.hidden_size;
    const T* rb = wb + dims.hidden_size;
    for (int64_t j = 0; j < dims.hidden_size; ++j) bias_.get()[j] = wb[j] + rb[j];
  }

  int64_t Stages() const { return 1; }
  Range StageGates(int64_t) const { return {0, 1}; }
  const T* StageInput(int64_t) const { return nullptr; }  // one stage: the driver multiplies H_{t-1}
  T* StageOutput(int64_t) const { return nullptr; }       // kAccumulate: the driver writes the gates
  void InitialState(int64_t) {}
  void Inactive(int64_t, int64_t, int64_t, Range) {}
  void FinalState(int64_t, bool) {}

  // The block's pre-activations (X W^T + H_{t-1} R^T) plus the biases, through clip and f, are H_t.
  void Pointwise(int64_t, int64_t, int64_t, Range units, const ForwardRow<T>& row) const {
    const int64_t count = units.end - units.begin;
    T* a = row.gates;
    if (bias_.get() != nullptr) {
      const T* bias = bias_.get() + units.begin;
      for (int64_t j = 0; j < count; ++j) a[j] += bias[j];
    }
    cell_.Forward(a, count);
    std::copy_n(a, count, row.h_out);
  }

 private:
  const RnnCell<T> cell_;
  Scratch<T> bias_;  // [H] Wb + Rb of this direction, empty without B
};

}  // namespace

template <typename T>
void RnnForward(const LstmDims& dims, const LstmConfig& config, const RnnForwardTensors<T>& tensors,
                const Executor& executor, const ScratchAllocator& allocator) {
  const ForwardIo<T> io = ForwardIoOf<T>(tensors, nullptr, config.matmul_precision);
  RunForward<T, RnnForwardCell<T>>(dims, io, {config.IsReverse(0), config.IsReverse(1)}, executor, allocator,
                                   [&](int64_t d, StepSplit) {
                                     return std::make_unique<RnnForwardCell<T>>(dims, config, tensors, d, allocator);
                                   });
}

template void RnnForward<float>(const LstmDims&, const LstmConfig&, const RnnForwardTensors<float>&, const Executor&,
                                const ScratchAllocator&);
template void RnnForward<double>(const LstmDims&, const LstmConfig&, const RnnForwardTensors<double>&,
                                 const Executor&, const ScratchAllocator&);

}  // namespace ortlstm
