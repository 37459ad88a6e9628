// GRU forward for GRUTraining: one GEMM projects X for all steps (X W^T, gates z r h), then each
// step adds the recurrent term and runs the pointwise pass. Layouts: lstm/lstm_dims.h (gates = 3).
//
//   z = f(Xt Wz^T + Ht-1 Rz^T + Wbz + Rbz)          (clip, when set, before f and g)
//   r = f(Xt Wr^T + Ht-1 Rr^T + Wbr + Rbr)
//   h = g(Xt Wh^T + (r . Ht-1) Rh^T + Rbh + Wbh)     linear_before_reset = 0
//   h = g(Xt Wh^T + r . (Ht-1 Rh^T + Rbh) + Wbh)     linear_before_reset = 1
//   Ht = (1 - z) . h + z . Ht-1
//
// The recurrent GEMM of a step covers every batch entry; an entry past its sequence length
// passes its state through and its outputs of that step are zero (as the LSTM's are).
#include <algorithm>

#include "common/blas.h"
#include "gru/gru_math.h"
#include "lstm/gate_math.h"

namespace ortlstm {
namespace {

template <typename T>
class GruForwardDirection {
 public:
  GruForwardDirection(const LstmDims& dims, const GruConfig& config, const GruForwardTensors<T>& io, int64_t d,
                      const ScratchAllocator& allocator)
      : dims_(dims),
        config_(config),
        io_(io),
        d_(d),
        H_(dims.hidden_size),
        width_(dims.GateWidth()),
        W_(io.W + d * width_ * dims.input_size),
        R_(io.R + d * width_ * H_),
        gates_(allocator, dims.Rows() * width_),
        bias_(allocator, 2 * width_),
        h_(allocator, dims.batch_size * H_),
        rec_(allocator, dims.batch_size * width_),
        act_(allocator, dims.batch_size * width_),
        rh_(allocator, dims.batch_size * H_) {
    for (int64_t j = 0; j < 2 * width_; ++j) bias_.get()[j] = io.B ? io.B[d * 2 * width_ + j] : T(0);
  }

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
      // gates [T*N, 3H] = X [T*N, I] * W^T
      ParallelGemm(executor, false, true, dims_.Rows(), width_, dims_.input_size, T(1), io_.X, dims_.input_size, W_,
                   dims_.input_size, T(0), gates_.get(), width_);
      const bool reverse = config_.cell.IsReverse(d_);
      for (int64_t s = 0; s < dims_.seq_length; ++s) Step(reverse ? dims_.seq_length - 1 - s : s);
    }
    WriteFinalState();
  }

 private:
  bool Active(int64_t t, int64_t b) const { return io_.sequence_lens == nullptr || t < io_.sequence_lens[b]; }

  void Step(int64_t t) {
    const int64_t N = dims_.batch_size;
    const int64_t H = H_;
    const Activation f = config_.cell.activations[d_].f;
    const Activation g = config_.cell.activations[d_].g;
    const bool clip = config_.cell.clip.has_value();
    const T threshold = clip ? static_cast<T>(*config_.cell.clip) : T(0);
    const T* wb = bias_.get();
    const T* rb = bias_.get() + width_;
    T* h = h_.get();
    T* rec = rec_.get();
    // rec[:, zr (and h with linear_before_reset)] = H_{t-1} R^T
    const int64_t first_columns = config_.linear_before_reset ? width_ : 2 * H;
    Gemm(false, true, N, first_columns, H, T(1), h, H, R_, H, T(0), rec, width_);
    for (int64_t b = 0; b < N; ++b) {
      if (!Active(t, b)) continue;
      const T* x = gates_.get() + dims_.XRow(t, b) * width_;
      T* a = act_.get() + b * width_;
      for (int64_t j = 0; j < 2 * H; ++j) a[j] = x[j] + wb[j] + rb[j] + rec[b * width_ + j];
      if (clip) ClipInPlace(a, 2 * H, threshold);
      ApplyInPlace(f, a, 2 * H);
      if (!config_.linear_before_reset) {
        for (int64_t j = 0; j < H; ++j) rh_.get()[b * H + j] = a[H + j] * h[b * H + j];
      }
    }
    if (!config_.linear_before_reset) {
      // rec[:, h] = (r . H_{t-1}) Rh^T; rows of inactive entries are never read.
      Gemm(false, true, N, H, H, T(1), rh_.get(), H, R_ + 2 * H * H, H, T(0), rec + 2 * H, width_);
    }
    for (int64_t b = 0; b < N; ++b) {
      const int64_t seq_row = dims_.SeqRow(t, d_, b);
      if (!Active(t, b)) {
        if (io_.HAll) std::fill_n(io_.HAll + seq_row * H, H, T(0));
        if (io_.ZRH) std::fill_n(io_.ZRH + seq_row * width_, width_, T(0));
        continue;
      }
      const T* x = gates_.get() + dims_.XRow(t, b) * width_ + 2 * H;
      T* a = act_.get() + b * width_;
      const T* r = a + H;
      T* hh = a + 2 * H;
      const T* q = rec + b * width_ + 2 * H;
      if (config_.linear_before_reset) {
        for (int64_t j = 0; j < H; ++j) hh[j] = x[j] + wb[2 * H + j] + r[j] * (q[j] + rb[2 * H + j]);
      } else {
        for (int64_t j = 0; j < H; ++j) hh[j] = x[j] + wb[2 * H + j] + rb[2 * H + j] + q[j];
      }
      if (clip) ClipInPlace(hh, H, threshold);
      ApplyInPlace(g, hh, H);
      T* state = h + b * H;
      for (int64_t j = 0; j < H; ++j) state[j] = (T(1) - a[j]) * hh[j] + a[j] * state[j];
      if (io_.HAll) std::copy_n(state, H, io_.HAll + seq_row * H);
      if (io_.ZRH) std::copy_n(a, width_, io_.ZRH + seq_row * width_);
    }
  }

  // An entry that ran no step reports a zero final state, as the LSTM ops do.
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
  const GruConfig& config_;
  const GruForwardTensors<T>& io_;
  const int64_t d_;
  const int64_t H_;
  const int64_t width_;
  const T* W_;     // [3H, I] of this direction
  const T* R_;     // [3H, H] of this direction
  Scratch<T> gates_;  // [T*N, 3H] X W^T, X row order
  Scratch<T> bias_;   // [6H] Wb, Rb
  Scratch<T> h_;      // [N, H] the state
  Scratch<T> rec_;    // [N, 3H] the step's recurrent products
  Scratch<T> act_;    // [N, 3H] the step's activated z, r, h
  Scratch<T> rh_;     // [N, H] r . H_{t-1} (linear_before_reset = 0)
};

}  // namespace

template <typename T>
void GruForward(const LstmDims& dims, const GruConfig& config, const GruForwardTensors<T>& tensors,
                const Executor& executor, const ScratchAllocator& allocator) {
  for (int64_t d = 0; d < dims.num_directions; ++d) {
    GruForwardDirection<T>(dims, config, tensors, d, allocator).Run(executor);
  }
}

template void GruForward<float>(const LstmDims&, const GruConfig&, const GruForwardTensors<float>&, const Executor&,
                                const ScratchAllocator&);
template void GruForward<double>(const LstmDims&, const GruConfig&, const GruForwardTensors<double>&,
                                 const Executor&, const ScratchAllocator&);

}  // namespace ortlstm
