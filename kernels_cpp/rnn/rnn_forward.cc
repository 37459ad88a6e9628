// RNN forward for RNNTraining: one GEMM projects X for all steps (X W^T, the biases added once),
// then each step adds H_{t-1} R^T into that step's rows and runs the cell (rnn/rnn_cell.h) on each
// row block. Layouts: lstm/lstm_dims.h (gates = 1).
//
//   H_t = f(clip(X_t W^T + H_{t-1} R^T + Wb + Rb))
//
// The recurrent GEMM of a step covers every batch entry; an entry past its sequence length
// passes its state through and its output of that step is zero (as the LSTM's and GRU's are).
#include <algorithm>

#include "common/blas.h"
#include "rnn/rnn_cell.h"
#include "rnn/rnn_math.h"

namespace ortlstm {
namespace {

template <typename T>
class RnnForwardDirection {
 public:
  RnnForwardDirection(const LstmDims& dims, const LstmConfig& config, const RnnForwardTensors<T>& io, int64_t d,
                      const ScratchAllocator& allocator)
      : dims_(dims),
        config_(config),
        io_(io),
        d_(d),
        H_(dims.hidden_size),
        W_(io.W + d * H_ * dims.input_size),
        R_(io.R + d * H_ * H_),
        cell_(config.activations[d].f, config.clip),
        pre_(allocator, dims.Rows() * H_),
        h_(allocator, dims.batch_size * H_) {}

  void Run(const Executor& executor) {
    const int64_t N = dims_.batch_size;
    for (int64_t b = 0; b < N; ++b) {
      if (io_.initial_h) {
        std::copy_n(io_.initial_h + dims_.StateRow(d_, b) * H_, H_, h_.get() + b * H_);
      } else {
        std::fill_n(h_.get() + b * H_, H_, T(0));
      }
    }
    if (dims_.Rows() > 0) {
      // pre [T*N, H] = X [T*N, I] * W^T + Wb + Rb
      ParallelGemm(executor, false, true, dims_.Rows(), H_, dims_.input_size, T(1), io_.X, dims_.input_size, W_,
                   dims_.input_size, T(0), pre_.get(), H_);
      if (io_.B) {
        const T* wb = io_.B + d_ * 2 * H_;
        const T* rb = wb + H_;
        for (int64_t row = 0; row < dims_.Rows(); ++row) {
          T* p = pre_.get() + row * H_;
          for (int64_t j = 0; j < H_; ++j) p[j] += wb[j] + rb[j];
        }
      }
      const bool reverse = config_.IsReverse(d_);
      for (int64_t s = 0; s < dims_.seq_length; ++s) Step(reverse ? dims_.seq_length - 1 - s : s);
    }
    WriteFinalState();
  }

 private:
  bool Active(int64_t t, int64_t b) const { return io_.sequence_lens == nullptr || t < io_.sequence_lens[b]; }

  void Step(int64_t t) {
    const int64_t N = dims_.batch_size;
    const int64_t H = H_;
    T* rows = pre_.get() + dims_.XRow(t, 0) * H;
    const int64_t ld = dims_.BatchStride() * H;
    // pre[step t] += H_{t-1} R^T; rows of inactive entries are never read.
    Gemm(false, true, N, H, H, T(1), h_.get(), H, R_, H, T(1), rows, ld);
    for (int64_t b = 0; b < N; ++b) {
      const int64_t seq_row = dims_.SeqRow(t, d_, b);
      if (!Active(t, b)) {
        if (io_.HAll) std::fill_n(io_.HAll + seq_row * H, H, T(0));
        continue;
      }
      T* a = rows + b * ld;
      cell_.Forward(a, H);
      std::copy_n(a, H, h_.get() + b * H);
      if (io_.HAll) std::copy_n(a, H, io_.HAll + seq_row * H);
    }
  }

  // An entry that ran no step reports a zero final state, as the LSTM and GRU ops do.
  void WriteFinalState() {
    if (!io_.Ht) return;
    for (int64_t b = 0; b < dims_.batch_size; ++b) {
      T* out = io_.Ht + dims_.StateRow(d_, b) * H_;
      const bool ran = dims_.seq_length > 0 && (io_.sequence_lens == nullptr || io_.sequence_lens[b] > 0);
      if (ran) {
        std::copy_n(h_.get() + b * H_, H_, out);
      } else {
        std::fill_n(out, H_, T(0));
      }
    }
  }

  const LstmDims& dims_;
  const LstmConfig& config_;
  const RnnForwardTensors<T>& io_;
  const int64_t d_;
  const int64_t H_;
  const T* W_;  // [H, I] of this direction
  const T* R_;  // [H, H] of this direction
  const RnnCell<T> cell_;
  Scratch<T> pre_;  // [T*N, H] pre-activations, then states, X row order
  Scratch<T> h_;    // [N, H] the state
};

}  // namespace

template <typename T>
void RnnForward(const LstmDims& dims, const LstmConfig& config, const RnnForwardTensors<T>& tensors,
                const Executor& executor, const ScratchAllocator& allocator) {
  for (int64_t d = 0; d < dims.num_directions; ++d) {
    RnnForwardDirection<T>(dims, config, tensors, d, allocator).Run(executor);
  }
}

template void RnnForward<float>(const LstmDims&, const LstmConfig&, const RnnForwardTensors<float>&, const Executor&,
                                const ScratchAllocator&);
template void RnnForward<double>(const LstmDims&, const LstmConfig&, const RnnForwardTensors<double>&,
                                 const Executor&, const ScratchAllocator&);

}  // namespace ortlstm
