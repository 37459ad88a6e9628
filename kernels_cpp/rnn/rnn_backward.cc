// RNN backward for RNNGrad. f' comes from HAll (f's output, rnn/rnn_cell.h) and H_{t-1} from HAll
// (or initial_h), so only dL/dH runs through the time loop; dX, dW, dR and dB are GEMMs over all
// steps afterwards. Layouts: lstm/lstm_dims.h (gates = 1).
//
// With dH = dL/dH_t (from step t+1 plus grad_HAll):
//   da = dH . f'(a)     dH_{t-1} = da R     (an entry past its length passes dH through)
//   dX = da W,  dW = da^T X,  dR = da^T H_{t-1},  dWb = dRb = sum da
#include <algorithm>

#include "common/blas.h"
#include "recurrent/recurrent_gemm.h"
#include "rnn/rnn_cell.h"
#include "rnn/rnn_math.h"

namespace ortlstm {
namespace {

template <typename T>
class RnnBackwardDirection {
 public:
  RnnBackwardDirection(const LstmDims& dims, const LstmConfig& config, const RnnBackwardTensors<T>& io, int64_t d,
                       const ScratchAllocator& allocator)
      : dims_(dims),
        config_(config),
        io_(io),
        d_(d),
        H_(dims.hidden_size),
        W_(io.W + d * H_ * dims.input_size),
        R_(io.R + d * H_ * H_),
        cell_(config.activations[d].f, config.clip),
        hidden_prev_(allocator, dims.Rows() * H_),
        grad_pre_(allocator, dims.Rows() * H_),
        dh_(allocator, dims.batch_size * H_),
        dh_prev_(allocator, dims.batch_size * H_),
        prime_(allocator, H_) {}

  void Run(const Executor& executor) {
    const int64_t N = dims_.batch_size;
    for (int64_t b = 0; b < N; ++b) {
      T* dh = dh_.get() + b * H_;
      const bool ran = dims_.seq_length > 0 && (io_.sequence_lens == nullptr || io_.sequence_lens[b] > 0);
      if (io_.grad_Ht && ran) {
        std::copy_n(io_.grad_Ht + dims_.StateRow(d_, b) * H_, H_, dh);
      } else {
        std::fill_n(dh, H_, T(0));
      }
    }
    if (dims_.Rows() > 0) {
      GatherHiddenPrev();
      const bool reverse = config_.IsReverse(d_);
      // R for dH_{t-1} = da R, once per op call (a bf16 operand rounds it here).
      const StepOperand<T> weight(config_.matmul_precision, false, false, N, H_, H_, R_, H_);
      for (int64_t s = dims_.seq_length - 1; s >= 0; --s) Step(reverse ? dims_.seq_length - 1 - s : s, weight);
    }
    if (io_.dH0) {
      for (int64_t b = 0; b < N; ++b) std::copy_n(dh_.get() + b * H_, H_, io_.dH0 + dims_.StateRow(d_, b) * H_);
    }
    WeightGradients(executor);
  }

 private:
  bool Active(int64_t t, int64_t b) const { return io_.sequence_lens == nullptr || t < io_.sequence_lens[b]; }

  // hidden_prev [T*N, H], X row order: the state each step started from.
  void GatherHiddenPrev() {
    const bool reverse = config_.IsReverse(d_);
    for (int64_t b = 0; b < dims_.batch_size; ++b) {
      const T* state = io_.initial_h ? io_.initial_h + dims_.StateRow(d_, b) * H_ : nullptr;
      for (int64_t s = 0; s < dims_.seq_length; ++s) {
        const int64_t t = reverse ? dims_.seq_length - 1 - s : s;
        T* out = hidden_prev_.get() + dims_.XRow(t, b) * H_;
        if (state) {
          std::copy_n(state, H_, out);
        } else {
          std::fill_n(out, H_, T(0));
        }
        if (Active(t, b)) state = io_.HAll + dims_.SeqRow(t, d_, b) * H_;
      }
    }
  }

  void Step(int64_t t, const StepOperand<T>& weight) {
    const int64_t N = dims_.batch_size;
    const int64_t H = H_;
    T* rows = grad_pre_.get() + dims_.XRow(t, 0) * H;
    const int64_t ld = dims_.BatchStride() * H;
    for (int64_t b = 0; b < N; ++b) {
      T* da = rows + b * ld;
      const T* dh = dh_.get() + b * H;
      T* dhp = dh_prev_.get() + b * H;
      if (!Active(t, b)) {
        std::fill_n(da, H, T(0));
        std::copy_n(dh, H, dhp);
        continue;
      }
      const int64_t seq_row = dims_.SeqRow(t, d_, b);
      const T* grad_hall = io_.grad_HAll ? io_.grad_HAll + seq_row * H : nullptr;
      cell_.Backward(io_.HAll + seq_row * H, dh, grad_hall, prime_.get(), da, H);
      std::fill_n(dhp, H, T(0));
    }
    // dH_{t-1} += da R; inactive rows add zeros to their passed-through dH.
    weight.Multiply(rows, ld, T(1), dh_prev_.get(), H, N);
    std::swap(dh_, dh_prev_);
  }

  void WeightGradients(const Executor& executor) {
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

  const LstmDims& dims_;
  const LstmConfig& config_;
  const RnnBackwardTensors<T>& io_;
  const int64_t d_;
  const int64_t H_;
  const T* W_;  // [H, I] of this direction
  const T* R_;  // [H, H] of this direction
  const RnnCell<T> cell_;
  Scratch<T> hidden_prev_;  // [T*N, H] H_{t-1} of each step, X row order
  Scratch<T> grad_pre_;     // [T*N, H] da, X row order
  Scratch<T> dh_;           // [N, H] dL/dH_t
  Scratch<T> dh_prev_;      // [N, H] dL/dH_{t-1}
  Scratch<T> prime_;        // [H] f' of one entry
};

}  // namespace

template <typename T>
void RnnBackward(const LstmDims& dims, const LstmConfig& config, const RnnBackwardTensors<T>& tensors,
                 const Executor& executor, const ScratchAllocator& allocator) {
  for (int64_t d = 0; d < dims.num_directions; ++d) {
    RnnBackwardDirection<T>(dims, config, tensors, d, allocator).Run(executor);
  }
}

template void RnnBackward<float>(const LstmDims&, const LstmConfig&, const RnnBackwardTensors<float>&,
                                 const Executor&, const ScratchAllocator&);
template void RnnBackward<double>(const LstmDims&, const LstmConfig&, const RnnBackwardTensors<double>&,
                                  const Executor&, const ScratchAllocator&);

}  // namespace ortlstm
