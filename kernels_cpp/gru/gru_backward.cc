// GRU backward for GRUGrad. The activated gates come from the stash (ZRH) and H_{t-1} from HAll
// (or initial_h), so only dL/dH runs through the time loop; everything that does not depend on
// it is a GEMM over all steps: with linear_before_reset = 1 the term H_{t-1} Rh^T that the reset
// gate multiplies (Q below), and afterwards dX, dW and dR. Layouts: lstm/lstm_dims.h (gates = 3).
//
// With dH = dL/dH_t (from later steps plus grad_HAll) and primes taken from the activations'
// outputs (zero where clip held the pre-activation):
//   dz = dH . (H_{t-1} - h) . f'(z)            da = dH . (1 - z) . g'(h)    (a: h's pre-activation)
//   linear_before_reset = 1:  dr = da . Q' . f'(r), dq = da . r     (Q' = H_{t-1} Rh^T + Rbh)
//     dH_{t-1} = dH . z + [dz dr dq] R;    dR = [dz dr dq]^T H_{t-1};  dRb = sum [dz dr dq]
//   linear_before_reset = 0:  d(rH) = da Rh, dr = d(rH) . H_{t-1} . f'(r)
//     dH_{t-1} = dH . z + d(rH) . r + [dz dr] Rzr;   dRzr = [dz dr]^T H_{t-1}, dRh = da^T (r . H_{t-1})
//   dX = [dz dr da] W,  dW = [dz dr da]^T X,  dWb = sum [dz dr da]  (and dRb = dWb when lbr = 0)
//
// The time loop is cut into executor tasks by groups of batch entries, as the LSTM's is
// (SplitTimeLoop, lstm/lstm_math.h; entries are independent through the recurrence, so each task
// takes its rows through every step), and the two directions of a bidirectional GRU run as two
// tasks when the executor has the width (recurrent/backward_helpers.h: RunBackward, shared with the
// RNN); the GEMMs over all steps (Q, dX, dW, dR) follow.
#include <algorithm>
#include <vector>

#include "common/blas.h"
#include "gru/gru_math.h"
#include "lstm/gate_math.h"
#include "lstm/lstm_math.h"
#include "recurrent/backward_helpers.h"
#include "recurrent/recurrent_gemm.h"

namespace ortlstm {
namespace {

template <typename T>
class GruBackwardDirection {
 public:
  GruBackwardDirection(const LstmDims& dims, const GruConfig& config, const GruBackwardTensors<T>& io, int64_t d,
                       int64_t groups, const ScratchAllocator& allocator)
      : dims_(dims),
        config_(config),
        io_(io),
        d_(d),
        H_(dims.hidden_size),
        width_(dims.GateWidth()),
        lbr_(config.linear_before_reset),
        groups_(groups),
        W_(io.W + d * width_ * dims.input_size),
        R_(io.R + d * width_ * H_),
        f_(config.cell.activations[d].f, config.cell.clip),
        g_(config.cell.activations[d].g, config.cell.clip),
        hidden_prev_(allocator, dims.Rows() * H_),
        grad_gates_(allocator, dims.Rows() * width_),
        grad_rec_(allocator, lbr_ ? dims.Rows() * width_ : 0),
        q_(allocator, lbr_ ? dims.Rows() * H_ : 0),
        reset_hidden_(allocator, lbr_ ? 0 : dims.Rows() * H_),
        dh_(allocator, dims.batch_size * H_),
        dh_prev_(allocator, dims.batch_size * H_),
        step_grad_(allocator, dims.batch_size * width_),
        d_rh_(allocator, lbr_ ? 0 : dims.batch_size * H_),
        prime_(allocator, groups * 2 * H_) {}

  // The time loop, from grad_Ht back to dH0: the gate gradients of every step, in X's row order.
  void Recurrence(const Executor& executor) {
    const int64_t rows = dims_.Rows();
    LastStepGradient(dims_, d_, io_.grad_Ht, io_.sequence_lens, dh_.get());
    if (rows > 0) {
      GatherHiddenPrev(dims_, d_, config_.cell.IsReverse(d_), io_.initial_h, io_.HAll, io_.sequence_lens,
                       hidden_prev_.get());
      if (lbr_) {
        // Q [T*N, H] = H_{t-1} Rh^T, every step at once.
        RecurrentParallelGemm(config_.cell.matmul_precision, executor, false, true, rows, H_, H_, hidden_prev_.get(),
                              H_, R_ + 2 * H_ * H_, H_, T(0), q_.get(), H_);
      }
      const bool reverse = config_.cell.IsReverse(d_);
      // The step GEMMs' weights, once per group of entries and op call (a bf16 operand rounds them
      // here): Rh for d(r . H_{t-1}) (linear_before_reset = 0), R[zr(h)] for dH_{t-1}.
      const MatmulPrecision precision = config_.cell.matmul_precision;
      std::vector<StepWeights> weights;
      for (int64_t k = 0; k < groups_; ++k) {
        const Range group = SplitRange(dims_.batch_size, groups_, k);
        const int64_t M = std::max<int64_t>(group.end - group.begin, 0);
        weights.push_back(
            {lbr_ ? StepOperand<T>() : StepOperand<T>(precision, false, false, M, H_, H_, R_ + 2 * H_ * H_, H_),
             StepOperand<T>(precision, false, false, M, H_, lbr_ ? width_ : 2 * H_, R_, H_)});
      }
      RunBackwardSteps(dims_, reverse, groups_, executor, &dh_, &dh_prev_,
                       [&](int64_t t, Range group, const T* dh, T* dh_prev, size_t k) {
                         Step(t, group, dh, dh_prev, prime_.get() + k * 2 * H_, weights[k]);
                       });
    }
    WriteInitialStateGradient(dims_, d_, dh_.get(), io_.dH0);
  }

  // dX (+)= this direction's share, dW, dR, dB: GEMMs over all steps.
  void WeightGradients(const Executor& executor) const {
    const int64_t rows = dims_.Rows();
    const int64_t I = dims_.input_size;
    const int64_t H = H_;
    T* dW = io_.dW ? io_.dW + d_ * width_ * I : nullptr;
    T* dR = io_.dR ? io_.dR + d_ * width_ * H : nullptr;
    T* dB = io_.dB ? io_.dB + d_ * 2 * width_ : nullptr;
    if (rows == 0) {
      if (dW) std::fill_n(dW, width_ * I, T(0));
      if (dR) std::fill_n(dR, width_ * H, T(0));
      if (dB) std::fill_n(dB, 2 * width_, T(0));
      if (io_.dX && d_ == 0) std::fill_n(io_.dX, rows * I, T(0));
      return;
    }
    const T* dg = grad_gates_.get();
    if (io_.dX) {
      RecurrentParallelGemm(config_.cell.matmul_precision, executor, false, false, rows, I, width_, dg, width_, W_, I,
                            d_ == 0 ? T(0) : T(1), io_.dX, I);
    }
    if (dW) RecurrentParallelGemm(config_.cell.matmul_precision, executor, true, false, width_, I, rows, dg, width_,
                                  io_.X, I, T(0), dW, I);
    if (dR) {
      if (lbr_) {
        RecurrentParallelGemm(config_.cell.matmul_precision, executor, true, false, width_, H, rows, grad_rec_.get(),
                              width_, hidden_prev_.get(), H, T(0), dR, H);
      } else {
        RecurrentParallelGemm(config_.cell.matmul_precision, executor, true, false, 2 * H, H, rows, dg, width_,
                              hidden_prev_.get(), H, T(0), dR, H);
        RecurrentParallelGemm(config_.cell.matmul_precision, executor, true, false, H, H, rows, dg + 2 * H, width_,
                              reset_hidden_.get(), H, T(0), dR + 2 * H * H, H);
      }
    }
    if (dB) {
      std::fill_n(dB, 2 * width_, T(0));
      const T* rec = lbr_ ? grad_rec_.get() : dg;
      for (int64_t row = 0; row < rows; ++row) {
        for (int64_t j = 0; j < width_; ++j) {
          dB[j] += dg[row * width_ + j];
          dB[width_ + j] += rec[row * width_ + j];
        }
      }
    }
  }

 private:
  // The right operands of a group's per-step GEMMs (Recurrence).
  struct StepWeights {
    StepOperand<T> reset_hidden;  // Rh [H, H]: d(r . H_{t-1}) = da Rh (linear_before_reset = 0)
    StepOperand<T> carry;         // R[zr(h)] [2H or 3H, H]: dH_{t-1} += [dz dr (dq)] R[zr(h)]
  };

  bool Active(int64_t t, int64_t b) const { return io_.sequence_lens == nullptr || t < io_.sequence_lens[b]; }

  // Step t for batch entries `group`: dh holds their dL/dH_t, dh_prev gets dL/dH_{t-1}; `prime`
  // [2H] is the task's room for f' and g'.
  void Step(int64_t t, Range group, const T* dh_all, T* dh_prev_all, T* prime, const StepWeights& weights) {
    const int64_t H = H_;
    const int64_t M = group.end - group.begin;
    if (M <= 0) return;
    const T* rb = io_.B ? io_.B + d_ * 2 * width_ + width_ : nullptr;
    T* step = step_grad_.get();
    T* fprime = prime;
    T* gprime = prime + H;
    for (int64_t b = group.begin; b < group.end; ++b) {
      const int64_t row = dims_.XRow(t, b);
      T* dg = grad_gates_.get() + row * width_;
      T* sg = step + b * width_;
      T* dhp = dh_prev_all + b * H;
      const T* dh = dh_all + b * H;
      if (!Active(t, b)) {
        std::fill_n(dg, width_, T(0));
        std::fill_n(sg, width_, T(0));
        if (lbr_) std::fill_n(grad_rec_.get() + row * width_, width_, T(0));
        if (!lbr_) std::fill_n(reset_hidden_.get() + row * H, H, T(0));
        std::copy_n(dh, H, dhp);
        continue;
      }
      const int64_t seq_row = dims_.SeqRow(t, d_, b);
      const T* z = io_.ZRH + seq_row * width_;
      const T* r = z + H;
      const T* hh = z + 2 * H;
      const T* hp = hidden_prev_.get() + row * H;
      const T* grad_hall = io_.grad_HAll ? io_.grad_HAll + seq_row * H : nullptr;
      f_.DerivativesFromOutputs(z, fprime, H);
      g_.DerivativesFromOutputs(hh, gprime, H);
      for (int64_t j = 0; j < H; ++j) {
        const T dH = dh[j] + (grad_hall ? grad_hall[j] : T(0));
        dg[j] = dH * (hp[j] - hh[j]) * fprime[j];
        dg[2 * H + j] = dH * (T(1) - z[j]) * gprime[j];
        dhp[j] = dH * z[j];
      }
      f_.DerivativesFromOutputs(r, fprime, H);
      if (lbr_) {
        const T* q = q_.get() + row * H;
        T* dq = grad_rec_.get() + row * width_;
        for (int64_t j = 0; j < H; ++j) {
          const T da = dg[2 * H + j];
          dg[H + j] = da * (q[j] + (rb ? rb[2 * H + j] : T(0))) * fprime[j];
          dq[j] = dg[j];
          dq[H + j] = dg[H + j];
          dq[2 * H + j] = da * r[j];
        }
        std::copy_n(dq, width_, sg);
      } else {
        T* rhp = reset_hidden_.get() + row * H;
        for (int64_t j = 0; j < H; ++j) rhp[j] = r[j] * hp[j];
        std::copy_n(dg, width_, sg);
      }
    }
    if (!lbr_) {
      // d(r . H_{t-1}) = da Rh; then the reset gate's share.
      T* d_rh = d_rh_.get();
      weights.reset_hidden.Multiply(step + group.begin * width_ + 2 * H, width_, T(0), d_rh + group.begin * H, H, M);
      for (int64_t b = group.begin; b < group.end; ++b) {
        if (!Active(t, b)) continue;
        const int64_t row = dims_.XRow(t, b);
        const T* r = io_.ZRH + dims_.SeqRow(t, d_, b) * width_ + H;
        const T* hp = hidden_prev_.get() + row * H;
        T* dg = grad_gates_.get() + row * width_;
        T* dhp = dh_prev_all + b * H;
        f_.DerivativesFromOutputs(r, fprime, H);
        for (int64_t j = 0; j < H; ++j) {
          dg[H + j] = d_rh[b * H + j] * hp[j] * fprime[j];
          step[b * width_ + H + j] = dg[H + j];
          dhp[j] += d_rh[b * H + j] * r[j];
        }
      }
    }
    // dH_{t-1} += [dz dr (dq)] R[zr(h)]; inactive rows add zeros to their passed-through dH.
    weights.carry.Multiply(step + group.begin * width_, width_, T(1), dh_prev_all + group.begin * H, H, M);
  }

  const LstmDims& dims_;
  const GruConfig& config_;
  const GruBackwardTensors<T>& io_;
  const int64_t d_;
  const int64_t H_;
  const int64_t width_;
  const bool lbr_;  // linear_before_reset
  const int64_t groups_;  // tasks of the time loop, each a group of batch entries
  const T* W_;      // [3H, I] of this direction
  const T* R_;      // [3H, H] of this direction
  const GateActivation<T> f_;
  const GateActivation<T> g_;
  Scratch<T> hidden_prev_;   // [T*N, H] H_{t-1} of each step, X row order
  Scratch<T> grad_gates_;    // [T*N, 3H] dz, dr, da, X row order
  Scratch<T> grad_rec_;      // [T*N, 3H] dz, dr, dq (linear_before_reset = 1)
  Scratch<T> q_;             // [T*N, H] H_{t-1} Rh^T (linear_before_reset = 1)
  Scratch<T> reset_hidden_;  // [T*N, H] r . H_{t-1} (linear_before_reset = 0)
  Scratch<T> dh_;            // [N, H] dL/dH_t
  Scratch<T> dh_prev_;       // [N, H] dL/dH_{t-1}
  Scratch<T> step_grad_;     // [N, 3H] the step's pre-activation gradients that multiply R
  Scratch<T> d_rh_;          // [N, H] dL/d(r . H_{t-1}) (linear_before_reset = 0)
  Scratch<T> prime_;         // [groups, 2H] f' and g' of one entry, one row per task
};

}  // namespace

template <typename T>
void GruBackward(const LstmDims& dims, const GruConfig& config, const GruBackwardTensors<T>& tensors,
                 const Executor& executor, const ScratchAllocator& allocator) {
  RunBackward<T>(dims, executor, [&](int64_t d, int64_t groups) {
    return GruBackwardDirection<T>(dims, config, tensors, d, groups, allocator);
  });
}

template void GruBackward<float>(const LstmDims&, const GruConfig&, const GruBackwardTensors<float>&,
                                 const Executor&, const ScratchAllocator&);
template void GruBackward<double>(const LstmDims&, const GruConfig&, const GruBackwardTensors<double>&,
                                  const Executor&, const ScratchAllocator&);

}  // namespace ortlstm
