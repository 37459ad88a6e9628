// RNN backward for RNNGrad. f' comes from HAll (f's output, rnn/rnn_cell.h) and H_{t-1} from HAll
// (or initial_h), so only dL/dH runs through the time loop; dX, dW, dR and dB are GEMMs over all
// steps afterwards. Layouts: lstm/lstm_dims.h (gates = 1).
//
// With dH = dL/dH_t (from step t+1 plus grad_HAll):
//   da = dH . f'(a)     dH_{t-1} = da R     (an entry past its length passes dH through)
//   dX = da W,  dW = da^T X,  dR = da^T H_{t-1},  dWb = dRb = sum da
//
// The time loop is cut into executor tasks by groups of batch entries and the two directions of
// a bidirectional RNN run as two tasks, as the GRU's are (recurrent/backward_helpers.h: RunBackward,
// with the states each step started from and dL/dH's ends).
#include <algorithm>
#include <vector>

#include "common/blas.h"
#include "recurrent/backward_helpers.h"
#include "recurrent/recurrent_gemm.h"
#include "rnn/rnn_cell.h"
#include "rnn/rnn_math.h"

namespace ortlstm {
namespace {

template <typename T>
class RnnBackwardDirection {
 public:
  RnnBackwardDirection(const LstmDims& dims, const LstmConfig& config, const RnnBackwardTensors<T>& io, int64_t d,
                       int64_t groups, const ScratchAllocator& allocator)
      : dims_(dims),
        config_(config),
        io_(io),
        d_(d),
        H_(dims.hidden_size),
        groups_(groups),
        W_(io.W + d * H_ * dims.input_size),
        R_(io.R + d * H_ * H_),
        cell_(config.activations[d].f, config.clip),
        hidden_prev_(allocator, dims.Rows() * H_),
        grad_pre_(allocator, dims.Rows() * H_),
        dh_(allocator, dims.batch_size * H_),
        dh_prev_(allocator, dims.batch_size * H_),
        prime_(allocator, groups * H_) {}

  // The time loop, from grad_Ht back to dH0: da of every step, in X's row order.
  void Recurrence(const Executor& executor) {
    LastStepGradient(dims_, d_, io_.grad_Ht, io_.sequence_lens, dh_.get());
    if (dims_.Rows() > 0) {
      const bool reverse = config_.IsReverse(d_);
      GatherHiddenPrev(dims_, d_, reverse, io_.initial_h, io_.HAll, io_.sequence_lens, hidden_prev_.get());
      // R for dH_{t-1} = da R, once per group of entries and op call (a bf16 operand rounds it here).
      std::vector<StepOperand<T>> weights;
      for (int64_t k = 0; k < groups_; ++k) {
        const Range group = SplitRange(dims_.batch_size, groups_, k);
        weights.emplace_back(config_.matmul_precision, false, false, std::max<int64_t>(group.end - group.begin, 0),
                             H_, H_, R_, H_);
      }
      RunBackwardSteps(dims_, reverse, groups_, executor, &dh_, &dh_prev_,
                       [&](int64_t t, Range group, const T* dh, T* dh_prev, size_t k) {
                         Step(t, group, dh, dh_prev, prime_.get() + k * H_, weights[k]);
                       });
    }
    WriteInitialStateGradient(dims_, d_, dh_.get(), io_.dH0);
  }

  // dX (+)= this direction's share, dW, dR, dB: GEMMs over all steps.
  void WeightGradients(const Executor& executor) const {
    const int64_t rows = dims_.Rows();
    const int64_t I = dims_.input_size;
    const int64_t H = H_;
    T* dW = io_.dW ? io_.dW + d_ * H * I : nullptr;
    T* dR = io_.dR ? io_.dR + d_ * H * H : nullptr;
    T* dB = io_.dB ? io_.dB + d_ * 2 * H : nullptr;
    if (rows == 0) {
      if (dW) std::fill_n(dW, H * I, T(0));
      if (dR) std::fill_n(dR, H * H, T(0));
      if (dB) std::fill_n(dB, 2 * H, T(0));
      return;
    }
    const T* da = grad_pre_.get();
    if (io_.dX) {
      RecurrentParallelGemm(config_.matmul_precision, executor, false, false, rows, I, H, da, H, W_, I,
                            d_ == 0 ? T(0) : T(1), io_.dX, I);
    }
    if (dW) RecurrentParallelGemm(config_.matmul_precision, executor, true, false, H, I, rows, da, H, io_.X, I, T(0),
                                  dW, I);
    if (dR) RecurrentParallelGemm(config_.matmul_precision, executor, true, false, H, H, rows, da, H,
                                  hidden_prev_.get(), H, T(0), dR, H);
    if (dB) {
      std::fill_n(dB, H, T(0));
      for (int64_t row = 0; row < rows; ++row) {
        for (int64_t j = 0; j < H; ++j) dB[j] += da[row * H + j];
      }
      std::copy_n(dB, H, dB + H);
    }
  }

 private:
  bool Active(int64_t t, int64_t b) const { return io_.sequence_lens == nullptr || t < io_.sequence_lens[b]; }

  // Step t for the batch entries of `group` (none: nothing to do): dh_all holds their dL/dH_t,
  // dh_prev_all gets dL/dH_{t-1}; `prime` [H] is the task's room for f'.
  void Step(int64_t t, Range group, const T* dh_all, T* dh_prev_all, T* prime, const StepOperand<T>& weight) {
    if (group.end <= group.begin) return;
    const int64_t H = H_;
    for (int64_t b = group.begin; b < group.end; ++b) {
      T* da = grad_pre_.get() + dims_.XRow(t, b) * H;
      const T* dh = dh_all + b * H;
      T* dhp = dh_prev_all + b * H;
      if (!Active(t, b)) {
        std::fill_n(da, H, T(0));
        std::copy_n(dh, H, dhp);
        continue;
      }
      const int64_t seq_row = dims_.SeqRow(t, d_, b);
      const T* grad_hall = io_.grad_HAll ? io_.grad_HAll + seq_row * H : nullptr;
      cell_.Backward(io_.HAll + seq_row * H, dh, grad_hall, prime, da, H);
      std::fill_n(dhp, H, T(0));
    }
    // dH_{t-1} += da R; inactive rows add zeros to their passed-through dH.
    weight.Multiply(grad_pre_.get() + dims_.XRow(t, group.begin) * H, dims_.BatchStride() * H, T(1),
                    dh_prev_all + group.begin * H, H, group.end - group.begin);
  }

  const LstmDims& dims_;
  const LstmConfig& config_;
  const RnnBackwardTensors<T>& io_;
  const int64_t d_;
  const int64_t H_;
  const int64_t groups_;  // tasks of the time loop, each a group of batch entries
  const T* W_;            // [H, I] of this direction
  const T* R_;            // [H, H] of this direction
  const RnnCell<T> cell_;
  Scratch<T> hidden_prev_;  // [T*N, H] H_{t-1} of each step, X row order
  Scratch<T> grad_pre_;     // [T*N, H] da, X row order
  Scratch<T> dh_;           // [N, H] dL/dH_t
  Scratch<T> dh_prev_;      // [N, H] dL/dH_{t-1}
  Scratch<T> prime_;        // [groups, H] f' of one entry, one row per task
};

}  // namespace

template <typename T>
void RnnBackward(const LstmDims& dims, const LstmConfig& config, const RnnBackwardTensors<T>& tensors,
                 const Executor& executor, const ScratchAllocator& allocator) {
  RunBackward<T>(dims, executor, [&](int64_t d, int64_t groups) {
    return RnnBackwardDirection<T>(dims, config, tensors, d, groups, allocator);
  });
}

template void RnnBackward<float>(const LstmDims&, const LstmConfig&, const RnnBackwardTensors<float>&,
                                 const Executor&, const ScratchAllocator&);
template void RnnBackward<double>(const LstmDims&, const LstmConfig&, const RnnBackwardTensors<double>&,
                                  const Executor&, const ScratchAllocator&);

}  // namespace ortlstm
