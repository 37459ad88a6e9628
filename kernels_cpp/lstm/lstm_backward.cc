// LSTM backward for LSTMGrad, as the cell policy of the shared backward time loop
// (recurrent/backward_driver.h: the windows, the task split, the carry of a step's dpre through R
// into dH, dW, dX, dB and the directions are the driver's), from the stashed HAll, CAll and
// activated gates (no forward re-run). The cell holds its own math: its carried state dC, the
// pointwise pass that turns dH_t, dC_t into the pre-activation gradients of step t (a block of
// units of a group of entries at a time), and its window's share of dR and dP. Its carry rows are
// the window's gate gradients (K = 4H). Layouts: lstm/lstm_dims.h.
#include <algorithm>
#include <array>
#include <memory>
#include <type_traits>
#include <vector>

#include "common/blas.h"
#include "lstm/gate_math.h"
#include "lstm/lstm_math.h"
#include "lstm/standard_cell.h"
#include "recurrent/backward_driver.h"
#include "recurrent/recurrent_gemm.h"

namespace ortlstm {
namespace {

// Per-task temporaries of the pointwise pass, one row of hidden units each.
constexpr int kTemporaries = 5;

template <typename T>
class LstmBackwardCell {
 public:
  static constexpr int64_t kGates = 4;

  LstmBackwardCell(const BackwardLoop<T>& loop, const LstmConfig& config, const LstmBackwardTensors<T>& tensors,
                   const ScratchAllocator& allocator)
      : loop_(loop),
        config_(config),
        tensors_(tensors),
        P_(tensors.P ? tensors.P + loop.d * 3 * loop.hidden : nullptr),
        f_act_(config.activations[loop.d].f, config.clip),
        g_act_(config.activations[loop.d].g, config.clip),
        h_act_(config.activations[loop.d].h),
        standard_cell_(UsesStandardCell(config, loop.d, P_ != nullptr)),
        hidden_from_hall_(loop.dims.num_directions == 1 && loop.dims.layout == 0 && tensors.sequence_lens == nullptr),
        hidden_prev_(allocator, hidden_from_hall_ ? 0 : loop.WindowRows() * loop.hidden),
        grad_c_(allocator, loop.dims.batch_size * loop.hidden),
        temporaries_(allocator, loop.split.Tasks() * kTemporaries * loop.hidden),
        zeros_(allocator, loop.hidden) {
    std::fill_n(zeros_.get(), loop.hidden, T(0));
  }

  int64_t CarryDepth() const { return loop_.width; }
  const T* CarryRow(int64_t t) const { return loop_.GradRow(t, 0); }
  bool SeparateRecurrentBias() const { return false; }
  const T* RecurrentBiasRow(int64_t, int64_t) const { return nullptr; }
  void BeginWindow(int64_t, int64_t, const Executor&) {}

  // dC at the last step: grad_Ct, zero for an entry that ran no step (its Ct is constant zero).
  void InitialGradState(int64_t b, bool ran) {
    const int64_t hidden = loop_.hidden;
    if (ran && tensors_.grad_Ct) {
      std::copy_n(tensors_.grad_Ct + loop_.dims.StateRow(loop_.d, b) * hidden, hidden, grad_c_.get() + b * hidden);
    } else {
      std::fill_n(grad_c_.get() + b * hidden, hidden, T(0));
    }
  }

  void FinalGradState(int64_t b) {
    const int64_t hidden = loop_.hidden;
    if (tensors_.dC0) {
      std::copy_n(grad_c_.get() + b * hidden, hidden, tensors_.dC0 + loop_.dims.StateRow(loop_.d, b) * hidden);
    }
  }

  void Inactive(int64_t t, int64_t b, Range units) {
    if (!hidden_from_hall_) std::fill_n(HiddenPrevRow(t, b) + units.begin, units.end - units.begin, T(0));
  }

  // Step t, hidden units [units.begin, units.end) of the active entries of [rows.begin,
  // rows.end): dpre_t, dC_{t-1}, H_{t-1}. `task` indexes the task's scratch.
  void Step(int64_t t, Range units, Range rows, int64_t task) {
    const int64_t hidden = loop_.hidden;
    const int64_t width = loop_.width;
    const int64_t count = units.end - units.begin;
    T* temporaries = temporaries_.get() + task * kTemporaries * hidden;
    T* dh = temporaries;                    // dL/dH_t
    T* h_of_c = temporaries + hidden;       // h(C_t), then scratch
    T* dh_of_c = temporaries + 2 * hidden;  // h'(C_t)
    T* dact = temporaries + 3 * hidden;     // a gate activation's derivative
    T* dc = temporaries + 4 * hidden;       // dL/dC_t
    for (int64_t b = rows.begin; b < rows.end; ++b) {
      if (!loop_.Active(t, b)) continue;
      T* dpre = loop_.GradRow(t, b);
      T* h_prev = hidden_from_hall_ ? nullptr : HiddenPrevRow(t, b) + units.begin;
      const int64_t seq_row = loop_.dims.SeqRow(t, loop_.d, b);
      if (h_prev) {  // else dR reads HAll directly (AddWindowGradients)
        const T* before = loop_.HiddenBefore(t, b);
        if (before) {
          std::copy_n(before + units.begin, count, h_prev);
        } else {
          std::fill_n(h_prev, count, T(0));
        }
      }
      const T* cp = PreviousCell(t, b) + units.begin;
      const T* cell = tensors_.CAll + seq_row * hidden + units.begin;
      const T* gate = tensors_.IOFC + seq_row * width;
      const T* gi = gate + units.begin;
      const T* go = gate + hidden + units.begin;
      const T* gf = gate + 2 * hidden + units.begin;
      const T* gc = gate + 3 * hidden + units.begin;
      T* dpre_i = dpre + units.begin;
      T* dpre_o = dpre + hidden + units.begin;
      T* dpre_f = dpre + 2 * hidden + units.begin;
      T* dpre_c = dpre + 3 * hidden + units.begin;
      T* grad_h = loop_.GradH() + b * hidden + units.begin;
      T* grad_c = grad_c_.get() + b * hidden + units.begin;
      const T* grad_hall = tensors_.grad_HAll ? tensors_.grad_HAll + seq_row * hidden + units.begin : nullptr;
      if (standard_cell_) {
        StandardCellBackward(
            StandardCellGradRow<T>{
                {gi, go, gf, gc}, cell, cp, grad_hall, grad_h, grad_c, {dpre_i, dpre_o, dpre_f, dpre_c}},
            count);
        continue;
      }

      // dH_t = dL/dHAll_t + (dH from step t+1, or grad_Ht)
      if (grad_hall) {
        for (int64_t j = 0; j < count; ++j) dh[j] = grad_h[j] + grad_hall[j];
      } else {
        std::copy_n(grad_h, count, dh);
      }
      // Ht = o . h(Ct):  dpre_o = dH_t . h(Ct) . f'(o),  dCt += dH_t . o . h'(Ct)
      std::copy_n(cell, count, h_of_c);
      ApplyInPlace(h_act_, h_of_c, count);
      DerivativeFromInputs(h_act_, cell, dh_of_c, count);
      f_act_.DerivativesFromOutputs(go, dact, count);
      for (int64_t j = 0; j < count; ++j) {
        dpre_o[j] = dh[j] * h_of_c[j] * dact[j];
        dc[j] = grad_c[j] + dh[j] * go[j] * dh_of_c[j];
      }
      if (P_) {
        const T* po = P_ + hidden + units.begin;
        for (int64_t j = 0; j < count; ++j) dc[j] += dpre_o[j] * po[j];  // o sees Po . Ct
      }
      // Ct = f . Ct-1 + i . c  (input_forget: f = 1 - i, so dCt/di = c - Ct-1)
      f_act_.DerivativesFromOutputs(gi, dact, count);
      if (config_.input_forget) {
        for (int64_t j = 0; j < count; ++j) {
          dpre_i[j] = dc[j] * (gc[j] - cp[j]) * dact[j];
          dpre_f[j] = T(0);
        }
      } else {
        for (int64_t j = 0; j < count; ++j) dpre_i[j] = dc[j] * gc[j] * dact[j];
        f_act_.DerivativesFromOutputs(gf, dact, count);
        for (int64_t j = 0; j < count; ++j) dpre_f[j] = dc[j] * cp[j] * dact[j];
      }
      g_act_.DerivativesFromOutputs(gc, dact, count);
      for (int64_t j = 0; j < count; ++j) dpre_c[j] = dc[j] * gi[j] * dact[j];
      // dCt-1 = dCt . f + dpre_i . Pi + dpre_f . Pf; dH_{t-1} is rebuilt from dpre by the GEMM.
      for (int64_t j = 0; j < count; ++j) {
        grad_c[j] = dc[j] * gf[j];
        grad_h[j] = T(0);
      }
      if (P_) {
        const T* pi = P_ + units.begin;
        const T* pf = P_ + 2 * hidden + units.begin;
        for (int64_t j = 0; j < count; ++j) grad_c[j] += dpre_i[j] * pi[j] + dpre_f[j] * pf[j];
      }
    }
  }

  // The window, times [lo, hi), adds its share of dR and dP; `first` starts the sums. Row (t, b)
  // of the window is row t*N + b of X past row lo*N.
  void AddWindowGradients(int64_t lo, int64_t hi, bool first, const Executor& executor) const {
    const LstmDims& dims = loop_.dims;
    const int64_t d = loop_.d;
    const int64_t batch = dims.batch_size;
    const int64_t hidden = loop_.hidden;
    const int64_t width = loop_.width;
    const int64_t rows = (hi - lo) * batch;  // with one window, all T*N rows in X's order
    const T* grad = loop_.GradGates();
    const T beta = first ? T(0) : T(1);
    const MatmulPrecision precision = config_.matmul_precision;
    // dR [4H, H] += dpre^T [4H, rows] * H_prev [rows, H]: M = 4H, N = H, K = rows, A transposed.
    T* dR = tensors_.dR ? tensors_.dR + d * width * hidden : nullptr;
    if (dR && !hidden_from_hall_) {
      RecurrentParallelGemm(precision, executor, true, false, width, hidden, rows, grad, width, hidden_prev_.get(),
                            hidden, beta, dR, hidden);
    } else if (dR) {
      // H_prev of a step is HAll of the step processed before it, one step of rows away (HAll
      // [T, 1, N, H] has X's row order here), except for the first step processed: initial_h.
      const bool reverse = loop_.reverse;
      const int64_t steps = dims.seq_length;
      const int64_t from = reverse ? lo : std::max<int64_t>(lo, 1);        // times with a
      const int64_t to = reverse ? std::min<int64_t>(hi, steps - 1) : hi;  // previous step
      const int64_t count = std::max<int64_t>(to - from, 0) * batch;
      const T* hidden_before = tensors_.HAll + (reverse ? from + 1 : from - 1) * batch * hidden;
      RecurrentParallelGemm(precision, executor, true, false, width, hidden, count, grad + (from - lo) * batch * width,
                            width, count > 0 ? hidden_before : tensors_.HAll, hidden, beta, dR, hidden);
      const int64_t start = reverse ? steps - 1 : 0;  // the first step processed
      if (tensors_.initial_h && start >= lo && start < hi) {
        RecurrentParallelGemm(precision, executor, true, false, width, hidden, batch,
                              grad + (start - lo) * batch * width, width, tensors_.initial_h, hidden, T(1), dR,
                              hidden);
      }
    }
    // dPi += sum dpre_i . Ct-1,  dPo += sum dpre_o . Ct,  dPf += sum dpre_f . Ct-1  (over t, b).
    if (tensors_.dP) {
      T* dPi = tensors_.dP + d * 3 * hidden;
      T* dPo = dPi + hidden;
      T* dPf = dPi + 2 * hidden;
      const int64_t parts = std::min<int64_t>(executor.Width(), hidden);
      executor.For(static_cast<size_t>(parts), [&](size_t k) {
        const Range units = SplitRange(hidden, parts, static_cast<int64_t>(k));
        if (first) {
          std::fill(dPi + units.begin, dPi + units.end, T(0));
          std::fill(dPo + units.begin, dPo + units.end, T(0));
          std::fill(dPf + units.begin, dPf + units.end, T(0));
        }
        for (int64_t t = lo; t < hi; ++t) {
          for (int64_t b = 0; b < batch; ++b) {
            if (!loop_.Active(t, b)) continue;
            const T* cp = PreviousCell(t, b);
            const T* cell = tensors_.CAll + dims.SeqRow(t, d, b) * hidden;
            const T* dpre = loop_.GradRow(t, b);
            for (int64_t j = units.begin; j < units.end; ++j) {
              dPi[j] += dpre[j] * cp[j];
              dPo[j] += dpre[hidden + j] * cell[j];
              dPf[j] += dpre[2 * hidden + j] * cp[j];
            }
          }
        }
      });
    }
  }

 private:
  T* HiddenPrevRow(int64_t t, int64_t b) const { return hidden_prev_.get() + loop_.WindowRow(t, b) * loop_.hidden; }

  // C_{t-1} [H] as step t of entry b saw it.
  const T* PreviousCell(int64_t t, int64_t b) const {
    const int64_t prev = loop_.PreviousStep(t, b);
    if (prev >= 0) return tensors_.CAll + loop_.dims.SeqRow(prev, loop_.d, b) * loop_.hidden;
    if (tensors_.initial_c) return tensors_.initial_c + loop_.dims.StateRow(loop_.d, b) * loop_.hidden;
    return zeros_.get();
  }

  const BackwardLoop<T>& loop_;
  const LstmConfig& config_;
  const LstmBackwardTensors<T>& tensors_;
  const T* P_;  // [3H] of this direction, or null
  const GateActivation<T> f_act_;
  const GateActivation<T> g_act_;
  const Activation h_act_;
  // Default activations, no clip, peepholes or input_forget: the fused StandardCellBackward.
  const bool standard_cell_;
  // One direction, layout 0, every sequence full: the rows of H_{t-1} are HAll's rows one step
  // away, so dR reads HAll and initial_h instead of a copy (hidden_prev_).
  const bool hidden_from_hall_;
  Scratch<T> hidden_prev_;  // [window rows, H]: H_{t-1} as step t saw it, 0 if inactive
  Scratch<T> grad_c_;       // [N, H] dL/dC flowing into the step being processed
  Scratch<T> temporaries_;  // [tasks, kTemporaries, H]
  Scratch<T> zeros_;        // [H] C_{t-1} of a first step without initial_c
};

}  // namespace

template <typename T>
void LstmBackward(const LstmDims& dims, const LstmConfig& config, const LstmBackwardTensors<T>& tensors,
                  const Executor& executor, const ScratchAllocator& allocator) {
  const bool any_output = tensors.dX || tensors.dW || tensors.dR || tensors.dB || tensors.dH0 || tensors.dC0 ||
                          tensors.dP;
  if (!any_output) return;
  const BackwardIo<T> io = BackwardIoOf<T>(tensors, config.matmul_precision);
  RunBackward<T, LstmBackwardCell<T>>(dims, io, {config.IsReverse(0), config.IsReverse(1)}, BackwardTasks{}, executor,
                                      allocator,
                                      [&](const BackwardLoop<T>& loop) {
                                        return std::make_unique<LstmBackwardCell<T>>(loop, config, tensors, allocator);
                                      });
}

template void LstmBackward<float>(const LstmDims&, const LstmConfig&, const LstmBackwardTensors<float>&,
                                  const Executor&, const ScratchAllocator&);
template void LstmBackward<double>(const LstmDims&, const LstmConfig&, const LstmBackwardTensors<double>&,
                                   const Executor&, const ScratchAllocator&);

}  // namespace ortlstm
