// LSTM forward for LSTMTraining: one GEMM projects X for all steps, then each step adds the
// recurrent term and runs the fused pointwise pass (bias, peepholes, clip, activations, state
// update, HAll/CAll/IOFC). A step is cut into blocks of hidden units run as executor tasks: each
// task does the recurrent GEMM for the four gate columns of its block and then that block's
// pointwise work, so a step costs one round of tasks. The two directions of a bidirectional LSTM
// run as two tasks when the executor has the width. Layouts: lstm/lstm_dims.h.
//
//   i = f(Xt Wi^T + Ht-1 Ri^T + Pi . Ct-1 + Wbi + Rbi)      (. = elementwise, clip before f/g)
//   f = f(Xt Wf^T + Ht-1 Rf^T + Pf . Ct-1 + Wbf + Rbf)      (input_forget: f = 1 - i)
//   c = g(Xt Wc^T + Ht-1 Rc^T + Wbc + Rbc)
//   Ct = f . Ct-1 + i . c
//   o = f(Xt Wo^T + Ht-1 Ro^T + Po . Ct + Wbo + Rbo)
//   Ht = o . h(Ct)
#include <algorithm>
#include <memory>

#include "common/blas.h"
#include "lstm/gate_math.h"
#include "lstm/lstm_math.h"

namespace ortlstm {
namespace {

// Scratch of one direction, allocated once per call.
template <typename T>
struct ForwardScratch {
  std::unique_ptr<T[]> gates;    // [T*N, 4H] X row order: pre-activations, activated in place
  std::unique_ptr<T[]> hidden;   // [2, N, H] H_{t-1} and H_t, swapped every step
  std::unique_ptr<T[]> cell;     // [N, H] C, updated in place (each hidden unit by one task)
  std::unique_ptr<T[]> bias;     // [4H] Wb + Rb, iofc
  explicit ForwardScratch(const LstmDims& dims)
      : gates(new T[dims.Rows() * dims.GateWidth()]),
        hidden(new T[2 * dims.batch_size * dims.hidden_size]),
        cell(new T[dims.batch_size * dims.hidden_size]),
        bias(new T[dims.GateWidth()]) {}
};

template <typename T>
class ForwardDirection {
 public:
  ForwardDirection(const LstmDims& dims, const LstmConfig& config, const LstmForwardTensors<T>& io, int64_t d,
                   ForwardScratch<T>& scratch)
      : dims_(dims),
        config_(config),
        io_(io),
        d_(d),
        hidden_size_(dims.hidden_size),
        width_(dims.GateWidth()),
        R_(io.R + d * width_ * hidden_size_),
        P_(io.P ? io.P + d * 3 * hidden_size_ : nullptr),
        f_act_(config.activations[d].f),
        g_act_(config.activations[d].g),
        h_act_(config.activations[d].h),
        scratch_(scratch) {}

  // gates [T*N, 4H] = X [T*N, I] * W^T: M = T*N, N = 4H, K = I, B transposed.
  void ProjectInputs(const Executor& executor) {
    const T* W = io_.W + d_ * width_ * dims_.input_size;
    ParallelGemm(executor, false, true, dims_.Rows(), width_, dims_.input_size, T(1), io_.X, dims_.input_size, W,
                 dims_.input_size, T(0), scratch_.gates.get(), width_);
  }

  void Run(const Executor& executor) {
    const int64_t batch_size = dims_.batch_size;
    T* bias = scratch_.bias.get();
    for (int64_t j = 0; j < width_; ++j) {
      bias[j] = io_.B ? io_.B[d_ * 2 * width_ + j] + io_.B[d_ * 2 * width_ + width_ + j] : T(0);
    }
    T* h = scratch_.hidden.get();
    T* c = scratch_.cell.get();
    for (int64_t b = 0; b < batch_size; ++b) {
      const int64_t state = dims_.StateRow(d_, b) * hidden_size_;
      if (io_.initial_h) {
        std::copy_n(io_.initial_h + state, hidden_size_, h + b * hidden_size_);
      } else {
        std::fill_n(h + b * hidden_size_, hidden_size_, T(0));
      }
      if (io_.initial_c) {
        std::copy_n(io_.initial_c + state, hidden_size_, c + b * hidden_size_);
      } else {
        std::fill_n(c + b * hidden_size_, hidden_size_, T(0));
      }
    }
    const int64_t blocks = StepBlocks(dims_, executor);
    const bool reverse = config_.IsReverse(d_);
    for (int64_t s = 0; s < dims_.seq_length; ++s) {
      const int64_t t = reverse ? dims_.seq_length - 1 - s : s;
      const T* h_prev = h + (s % 2) * batch_size * hidden_size_;
      T* h_next = h + ((s + 1) % 2) * batch_size * hidden_size_;
      executor.For(static_cast<size_t>(blocks), [&](size_t k) {
        const Range units = SplitRange(hidden_size_, blocks, static_cast<int64_t>(k));
        Step(t, units, h_prev, h_next);
      });
    }
    WriteFinalState(h + (dims_.seq_length % 2) * batch_size * hidden_size_);
  }

 private:
  // One step for hidden units [units.begin, units.end) of every batch entry.
  void Step(int64_t t, Range units, const T* h_prev, T* h_next) {
    const int64_t hidden = hidden_size_;
    const int64_t count = units.end - units.begin;
    if (count <= 0) return;
    T* step_gates = scratch_.gates.get() + dims_.XRow(t, 0) * width_;
    const int64_t step_ld = dims_.BatchStride() * width_;
    // For each gate g: gates[:, gH+j0 : gH+j1] += H_{t-1} [N, H] * R[gH+j0 : gH+j1, :]^T:
    // M = N, N = j1-j0, K = H, B transposed.
    for (int64_t g = 0; g < 4; ++g) {
      Gemm(false, true, dims_.batch_size, count, hidden, T(1), h_prev, hidden, R_ + (g * hidden + units.begin) * hidden,
           hidden, T(1), step_gates + g * hidden + units.begin, step_ld);
    }
    for (int64_t b = 0; b < dims_.batch_size; ++b) {
      const int64_t seq_row = dims_.SeqRow(t, d_, b);
      const bool active = io_.sequence_lens == nullptr || t < io_.sequence_lens[b];
      T* h_out = h_next + b * hidden + units.begin;
      if (!active) {
        // The state passes through unchanged; the step's outputs are zero.
        std::copy_n(h_prev + b * hidden + units.begin, count, h_out);
        if (io_.HAll) std::fill_n(io_.HAll + seq_row * hidden + units.begin, count, T(0));
        if (io_.CAll) std::fill_n(io_.CAll + seq_row * hidden + units.begin, count, T(0));
        if (io_.IOFC) {
          for (int64_t g = 0; g < 4; ++g) std::fill_n(io_.IOFC + seq_row * width_ + g * hidden + units.begin, count, T(0));
        }
        continue;
      }
      T* gates = scratch_.gates.get() + dims_.XRow(t, b) * width_;
      Cell(gates, scratch_.cell.get() + b * hidden, h_out, units);
      if (io_.HAll) std::copy_n(h_out, count, io_.HAll + seq_row * hidden + units.begin);
      if (io_.CAll) {
        std::copy_n(scratch_.cell.get() + b * hidden + units.begin, count, io_.CAll + seq_row * hidden + units.begin);
      }
      if (io_.IOFC) {
        for (int64_t g = 0; g < 4; ++g) {
          std::copy_n(gates + g * hidden + units.begin, count, io_.IOFC + seq_row * width_ + g * hidden + units.begin);
        }
      }
    }
  }

  // The pointwise part of one step for one batch entry: `gates` [4H] holds X W^T + H R^T and is
  // activated in place; `cell` [H] holds C_{t-1} and becomes C_t; h_out[0, count) gets H_t.
  void Cell(T* gates, T* cell, T* h_out, Range units) const {
    const int64_t hidden = hidden_size_;
    const int64_t count = units.end - units.begin;
    const T* bias = scratch_.bias.get();
    T* gi = gates + units.begin;
    T* go = gates + hidden + units.begin;
    T* gf = gates + 2 * hidden + units.begin;
    T* gc = gates + 3 * hidden + units.begin;
    T* c = cell + units.begin;
    const T* bi = bias + units.begin;
    const T* bo = bias + hidden + units.begin;
    const T* bf = bias + 2 * hidden + units.begin;
    const T* bc = bias + 3 * hidden + units.begin;
    for (int64_t j = 0; j < count; ++j) {
      gi[j] += bi[j];
      go[j] += bo[j];
      gf[j] += bf[j];
      gc[j] += bc[j];
    }
    if (P_) {
      const T* pi = P_ + units.begin;
      const T* pf = P_ + 2 * hidden + units.begin;
      for (int64_t j = 0; j < count; ++j) {
        gi[j] += pi[j] * c[j];
        gf[j] += pf[j] * c[j];
      }
    }
    const bool clip = config_.clip.has_value();
    const T threshold = clip ? static_cast<T>(*config_.clip) : T(0);
    if (clip) {
      ClipInPlace(gi, count, threshold);
      ClipInPlace(gf, count, threshold);
      ClipInPlace(gc, count, threshold);
    }
    ApplyInPlace(f_act_, gi, count);
    if (config_.input_forget) {
      for (int64_t j = 0; j < count; ++j) gf[j] = T(1) - gi[j];
    } else {
      ApplyInPlace(f_act_, gf, count);
    }
    ApplyInPlace(g_act_, gc, count);
    // Ct = f . Ct-1 + i . c
    for (int64_t j = 0; j < count; ++j) c[j] = gf[j] * c[j] + gi[j] * gc[j];
    if (P_) {
      const T* po = P_ + hidden + units.begin;
      for (int64_t j = 0; j < count; ++j) go[j] += po[j] * c[j];
    }
    if (clip) ClipInPlace(go, count, threshold);
    ApplyInPlace(f_act_, go, count);
    // Ht = o . h(Ct)
    std::copy_n(c, count, h_out);
    ApplyInPlace(h_act_, h_out, count);
    for (int64_t j = 0; j < count; ++j) h_out[j] *= go[j];
  }

  // An entry that ran no step reports a zero final state, not its initial state (as onnxruntime's
  // LSTM does), so nothing flows back from Ht/Ct into initial_h/initial_c for it.
  void WriteFinalState(const T* h) {
    for (int64_t b = 0; b < dims_.batch_size; ++b) {
      const int64_t state = dims_.StateRow(d_, b) * hidden_size_;
      const bool ran = dims_.seq_length > 0 && (io_.sequence_lens == nullptr || io_.sequence_lens[b] > 0);
      if (io_.Ht) {
        if (ran) {
          std::copy_n(h + b * hidden_size_, hidden_size_, io_.Ht + state);
        } else {
          std::fill_n(io_.Ht + state, hidden_size_, T(0));
        }
      }
      if (io_.Ct) {
        if (ran) {
          std::copy_n(scratch_.cell.get() + b * hidden_size_, hidden_size_, io_.Ct + state);
        } else {
          std::fill_n(io_.Ct + state, hidden_size_, T(0));
        }
      }
    }
  }

  const LstmDims& dims_;
  const LstmConfig& config_;
  const LstmForwardTensors<T>& io_;
  const int64_t d_;
  const int64_t hidden_size_;
  const int64_t width_;
  const T* R_;  // [4H, H] of this direction
  const T* P_;  // [3H] of this direction, or null
  const Activation f_act_;
  const Activation g_act_;
  const Activation h_act_;
  ForwardScratch<T>& scratch_;
};

}  // namespace

template <typename T>
void LstmForward(const LstmDims& dims, const LstmConfig& config, const LstmForwardTensors<T>& tensors,
                 const Executor& executor) {
  const int64_t num_directions = dims.num_directions;
  ForwardScratch<T> scratch0(dims);
  std::unique_ptr<ForwardScratch<T>> scratch1;
  if (num_directions == 2) scratch1 = std::make_unique<ForwardScratch<T>>(dims);
  ForwardDirection<T> forward(dims, config, tensors, 0, scratch0);
  std::unique_ptr<ForwardDirection<T>> backward;
  if (num_directions == 2) backward = std::make_unique<ForwardDirection<T>>(dims, config, tensors, 1, *scratch1);

  forward.ProjectInputs(executor);
  if (backward) backward->ProjectInputs(executor);
  if (backward && executor.Width() >= 2) {
    // The recurrences of the two directions are independent: one task each, serial inside.
    const SerialExecutor serial;
    executor.For(2, [&](size_t d) { (d == 0 ? forward : *backward).Run(serial); });
  } else {
    forward.Run(executor);
    if (backward) backward->Run(executor);
  }
}

template void LstmForward<float>(const LstmDims&, const LstmConfig&, const LstmForwardTensors<float>&,
                                 const Executor&);
template void LstmForward<double>(const LstmDims&, const LstmConfig&, const LstmForwardTensors<double>&,
                                  const Executor&);

}  // namespace ortlstm
