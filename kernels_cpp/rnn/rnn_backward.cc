// RNN backward for RNNGrad. f' comes from HAll (f's output, rnn/rnn_cell.h) and H_{t-1} from HAll
// (or initial_h), so only dL/dH runs through the time loop; dX, dW, dR and dB are GEMMs over all
// steps afterwards. Layouts: lstm/lstm_dims.h (gates = 1).
//
// With dH = dL/dH_t (from step t+1 plus grad_HAll):
//   da = dH . f'(a)     dH_{t-1} = da R     (an entry past its length passes dH through)
//   dX = da W,  dW = da^T X,  dR = da^T H_{t-1},  dWb = dRb = sum da
//
// The cell is the smallest policy of the shared backward time loop (recurrent/backward_driver.h:
// windows of steps, the task split, the carry da R, dX, dW, dB and the directions are the
// driver's): its pointwise step per block of units and, per window, dR.
#include <algorithm>
#include <array>
#include <memory>

#include "common/blas.h"
#include "recurrent/backward_driver.h"
#include "recurrent/recurrent_gemm.h"
#include "rnn/rnn_cell.h"
#include "rnn/rnn_math.h"

namespace ortlstm {
namespace {

template <typename T>
class RnnBackwardCell {
 public:
  static constexpr int64_t kGates = 1;

  RnnBackwardCell(const BackwardLoop<T>& loop, const LstmConfig& config, const RnnBackwardTensors<T>& io,
                  const ScratchAllocator& allocator)
      : loop_(loop),
        config_(config),
        io_(io),
        cell_(config.activations[loop.d].f, config.clip),
        hidden_prev_(allocator, loop.WindowRows() * loop.hidden),
        prime_(allocator, loop.split.Tasks() * loop.hidden) {}

  // dH_{t-1} += da R.
  int64_t CarryDepth() const { return loop_.hidden; }
  const T* CarryRow(int64_t t) const { return loop_.GradRow(t, 0); }
  bool SeparateRecurrentBias() const { return false; }
  const T* RecurrentBiasRow(int64_t, int64_t) const { return nullptr; }
  void InitialGradState(int64_t, bool) {}
  void FinalGradState(int64_t) {}
  void Inactive(int64_t, int64_t, Range) {}
  void BeginWindow(int64_t lo, int64_t hi, const Executor& executor) {
    GatherHiddenPrev(loop_, lo, hi, hidden_prev_.get(), executor);
  }

  // Step t for the active entries of `rows`, units `units`: da from GradH() (dL/dH_t's carried
  // part), and GradH() zeroed for the carry GEMM to fill.
  void Step(int64_t t, Range units, Range rows, int64_t task) {
    const int64_t H = loop_.hidden;
    const int64_t count = units.end - units.begin;
    T* prime = prime_.get() + task * H;
    for (int64_t b = rows.begin; b < rows.end; ++b) {
      if (!loop_.Active(t, b)) continue;
      const int64_t offset = loop_.dims.SeqRow(t, loop_.d, b) * H + units.begin;  // of HAll, grad_HAll
      T* dh = loop_.GradH() + b * H + units.begin;
      const T* grad_hall = io_.grad_HAll ? io_.grad_HAll + offset : nullptr;
      cell_.Backward(io_.HAll + offset, dh, grad_hall, prime, loop_.GradRow(t, b) + units.begin, count);
      std::fill_n(dh, count, T(0));
    }
  }

  // The window's share of dR = da^T H_{t-1}.
  void AddWindowGradients(int64_t lo, int64_t hi, bool first, const Executor& executor) const {
    if (!io_.dR) return;
    const int64_t H = loop_.hidden;
    const int64_t rows = (hi - lo) * loop_.dims.batch_size;
    RecurrentParallelGemm(config_.matmul_precision, executor, true, false, H, H, rows, loop_.GradGates(), H,
                          hidden_prev_.get(), H, first ? T(0) : T(1), io_.dR + loop_.d * H * H, H);
  }

 private:
  const BackwardLoop<T>& loop_;
  const LstmConfig& config_;
  const RnnBackwardTensors<T>& io_;
  const RnnCell<T> cell_;
  Scratch<T> hidden_prev_;  // [window rows, H] H_{t-1} of each step
  Scratch<T> prime_;        // [tasks, H] f' of one entry's block, one row per task
};

}  // namespace

template <typename T>
void RnnBackward(const LstmDims& dims, const LstmConfig& config, const RnnBackwardTensors<T>& tensors,
                 const Executor& executor, const ScratchAllocator& allocator) {
  const BackwardIo<T> io = BackwardIoOf<T>(tensors, config.matmul_precision);
  // Two directions always as two tasks, as before the shared driver: with the LSTM's rule M-bidir
  // (64, 32, 256, 256) took 1.2-1.3x as long at 2 threads (the 2-core VM, loaded: medians of
  // interleaved rounds); a step's GEMM (K = H) is a quarter of the LSTM's.
  RunBackward<T, RnnBackwardCell<T>>(dims, io, {config.IsReverse(0), config.IsReverse(1)}, BackwardTasks{true, true},
                                     executor, allocator,
                                     [&](const BackwardLoop<T>& loop) {
                                       return std::make_unique<RnnBackwardCell<T>>(loop, config, tensors, allocator);
                                     });
}

template void RnnBackward<float>(const LstmDims&, const LstmConfig&, const RnnBackwardTensors<float>&,
                                 const Executor&, const ScratchAllocator&);
template void RnnBackward<double>(const LstmDims&, const LstmConfig&, const RnnBackwardTensors<double>&,
                                  const Executor&, const ScratchAllocator&);

}  // namespace ortlstm
