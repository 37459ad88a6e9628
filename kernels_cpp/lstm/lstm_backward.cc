// LSTM backward for LSTMGrad, from the stashed HAll, CAll and activated gates (no forward re-run).
// The reverse time loop holds only the recurrence: a pointwise pass turns dH_t, dC_t into the
// pre-activation gradients of step t, and one GEMM carries dH back through R. dX, dW and dR are
// whole-sequence GEMMs after the loop, dB a column sum, dP a reduction. Layouts: lstm/lstm_dims.h.
#include <algorithm>
#include <vector>

#include "common/blas.h"
#include "lstm/gate_math.h"
#include "lstm/lstm_math.h"

namespace ortlstm {
namespace {

template <typename T>
struct DirectionScratch {
  T* grad_gates;   // [T*N, 4H] X row order: dL/d(pre-activation) of i, o, f, c
  T* hidden_prev;  // [T*N, H]  X row order: H_{t-1} as step t saw it (zero where inactive)
  T* grad_h;       // [N, H] dL/dH flowing into the step being processed
  T* grad_c;       // [N, H] dL/dC flowing into the step being processed
};

template <typename T>
void BackwardDirection(const LstmDims& dims, const LstmConfig& config, const LstmBackwardTensors<T>& io, int64_t d,
                       const DirectionScratch<T>& scratch, bool accumulate_dx) {
  const int64_t seq_length = dims.seq_length;
  const int64_t batch_size = dims.batch_size;
  const int64_t input_size = dims.input_size;
  const int64_t hidden = dims.hidden_size;
  const int64_t width = dims.GateWidth();
  const bool reverse = config.IsReverse(d);
  const T* W = io.W + d * width * input_size;  // [4H, I]
  const T* R = io.R + d * width * hidden;      // [4H, H]
  const T* P = io.P ? io.P + d * 3 * hidden : nullptr;
  const T* Pi = P;
  const T* Po = P ? P + hidden : nullptr;
  const T* Pf = P ? P + 2 * hidden : nullptr;
  const DirectionActivations& acts = config.activations[d];
  const GateActivation<T> f_act(acts.f, config.clip);
  const GateActivation<T> g_act(acts.g, config.clip);
  const Activation h_act = acts.h;
  T* grad_gates = scratch.grad_gates;
  T* hidden_prev = scratch.hidden_prev;
  T* grad_h = scratch.grad_h;
  T* grad_c = scratch.grad_c;

  auto length = [&](int64_t b) -> int64_t { return io.sequence_lens ? io.sequence_lens[b] : seq_length; };
  // The step before t in processing order, or -1 when t is the first step of entry b.
  auto previous_step = [&](int64_t t, int64_t b) -> int64_t {
    if (reverse) return t + 1 < length(b) ? t + 1 : -1;
    return t - 1;
  };

  // Ht/Ct of an entry that ran no step are constant zeros (lstm_forward.cc): their gradients stop.
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t state = dims.StateRow(d, b);
    T* gh = grad_h + b * hidden;
    T* gc = grad_c + b * hidden;
    const bool ran = length(b) > 0;
    if (ran && io.grad_Ht) {
      std::copy_n(io.grad_Ht + state * hidden, hidden, gh);
    } else {
      std::fill_n(gh, hidden, T(0));
    }
    if (ran && io.grad_Ct) {
      std::copy_n(io.grad_Ct + state * hidden, hidden, gc);
    } else {
      std::fill_n(gc, hidden, T(0));
    }
  }

  const int64_t step_ld = dims.BatchStride() * width;
  for (int64_t s = seq_length - 1; s >= 0; --s) {
    const int64_t t = reverse ? seq_length - 1 - s : s;
    for (int64_t b = 0; b < batch_size; ++b) {
      const int64_t x_row = dims.XRow(t, b);
      T* dpre = grad_gates + x_row * width;  // [4H]
      T* h_prev_row = hidden_prev + x_row * hidden;
      if (t >= length(b)) {
        std::fill_n(dpre, width, T(0));
        std::fill_n(h_prev_row, hidden, T(0));
        continue;
      }
      const int64_t seq_row = dims.SeqRow(t, d, b);
      const int64_t prev = previous_step(t, b);
      const int64_t state = dims.StateRow(d, b);
      const T* c_prev = prev >= 0 ? io.CAll + dims.SeqRow(prev, d, b) * hidden
                                  : (io.initial_c ? io.initial_c + state * hidden : nullptr);
      if (prev >= 0) {
        std::copy_n(io.HAll + dims.SeqRow(prev, d, b) * hidden, hidden, h_prev_row);
      } else if (io.initial_h) {
        std::copy_n(io.initial_h + state * hidden, hidden, h_prev_row);
      } else {
        std::fill_n(h_prev_row, hidden, T(0));
      }
      const T* cell = io.CAll + seq_row * hidden;
      const T* gate = io.IOFC + seq_row * width;
      const T* grad_hall = io.grad_HAll ? io.grad_HAll + seq_row * hidden : nullptr;
      T* gh = grad_h + b * hidden;
      T* gc = grad_c + b * hidden;
      for (int64_t j = 0; j < hidden; ++j) {
        const T gate_i = gate[j];
        const T gate_o = gate[hidden + j];
        const T gate_f = gate[2 * hidden + j];
        const T gate_c = gate[3 * hidden + j];
        const T cp = c_prev ? c_prev[j] : T(0);
        // dH_t = dL/dHAll_t + (dH from step t+1 or grad_Ht)
        const T dh = gh[j] + (grad_hall ? grad_hall[j] : T(0));
        // Ht = o . h(Ct):  do = dH_t . h(Ct),  dCt += dH_t . o . h'(Ct)
        const T dpre_o = dh * Apply<T>(h_act, cell[j]) * f_act.DerivativeFromOutput(gate_o);
        T dc = gc[j] + dh * gate_o * DerivativeFromInput<T>(h_act, cell[j]);
        if (P) dc += dpre_o * Po[j];  // o sees Po . Ct
        // Ct = f . Ct-1 + i . c  (input_forget: f = 1 - i, so dCt/di = c - Ct-1)
        const T dpre_i = dc * (config.input_forget ? gate_c - cp : gate_c) * f_act.DerivativeFromOutput(gate_i);
        const T dpre_f = config.input_forget ? T(0) : dc * cp * f_act.DerivativeFromOutput(gate_f);
        const T dpre_c = dc * gate_i * g_act.DerivativeFromOutput(gate_c);
        // dCt-1 = dCt . f + dpre_i . Pi + dpre_f . Pf
        T dc_prev = dc * gate_f;
        if (P) dc_prev += dpre_i * Pi[j] + dpre_f * Pf[j];
        dpre[j] = dpre_i;
        dpre[hidden + j] = dpre_o;
        dpre[2 * hidden + j] = dpre_f;
        dpre[3 * hidden + j] = dpre_c;
        gc[j] = dc_prev;
        gh[j] = T(0);  // replaced by dpre . R below; inactive rows keep theirs
      }
    }
    // dH_{t-1} [N, H] += dpre_t [N, 4H] * R [4H, H]: M = N, N = H, K = 4H, no transposes.
    Gemm(false, false, batch_size, hidden, width, T(1), grad_gates + dims.XRow(t, 0) * width, step_ld, R, hidden, T(1),
         grad_h, hidden);
  }

  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t state = dims.StateRow(d, b);
    if (io.dH0) std::copy_n(grad_h + b * hidden, hidden, io.dH0 + state * hidden);
    if (io.dC0) std::copy_n(grad_c + b * hidden, hidden, io.dC0 + state * hidden);
  }

  const int64_t rows = dims.Rows();
  // dX [T*N, I] (+)= dpre [T*N, 4H] * W [4H, I]: M = T*N, N = I, K = 4H.
  if (io.dX) {
    Gemm(false, false, rows, input_size, width, T(1), grad_gates, width, W, input_size, accumulate_dx ? T(1) : T(0),
         io.dX, input_size);
  }
  // dW [4H, I] = dpre^T [4H, T*N] * X [T*N, I]: M = 4H, N = I, K = T*N, A transposed.
  if (io.dW) {
    Gemm(true, false, width, input_size, rows, T(1), grad_gates, width, io.X, input_size, T(0),
         io.dW + d * width * input_size, input_size);
  }
  // dR [4H, H] = dpre^T [4H, T*N] * H_prev [T*N, H]: M = 4H, N = H, K = T*N, A transposed.
  if (io.dR) {
    Gemm(true, false, width, hidden, rows, T(1), grad_gates, width, hidden_prev, hidden, T(0),
         io.dR + d * width * hidden, hidden);
  }
  // dB [8H] = column sums of dpre, written to both the Wb and the Rb half.
  if (io.dB) {
    T* dB = io.dB + d * 2 * width;
    std::fill_n(dB, width, T(0));
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = grad_gates + r * width;
      for (int64_t j = 0; j < width; ++j) dB[j] += row[j];
    }
    std::copy_n(dB, width, dB + width);
  }
  // dPi = sum dpre_i . Ct-1,  dPo = sum dpre_o . Ct,  dPf = sum dpre_f . Ct-1  (over t, b).
  if (io.dP) {
    T* dPi = io.dP + d * 3 * hidden;
    T* dPo = dPi + hidden;
    T* dPf = dPi + 2 * hidden;
    std::fill_n(dPi, 3 * hidden, T(0));
    for (int64_t t = 0; t < seq_length; ++t) {
      for (int64_t b = 0; b < batch_size; ++b) {
        if (t >= length(b)) continue;
        const int64_t prev = previous_step(t, b);
        const int64_t state = dims.StateRow(d, b);
        const T* c_prev = prev >= 0 ? io.CAll + dims.SeqRow(prev, d, b) * hidden
                                    : (io.initial_c ? io.initial_c + state * hidden : nullptr);
        const T* cell = io.CAll + dims.SeqRow(t, d, b) * hidden;
        const T* dpre = grad_gates + dims.XRow(t, b) * width;
        for (int64_t j = 0; j < hidden; ++j) {
          const T cp = c_prev ? c_prev[j] : T(0);
          dPi[j] += dpre[j] * cp;
          dPo[j] += dpre[hidden + j] * cell[j];
          dPf[j] += dpre[2 * hidden + j] * cp;
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void LstmBackward(const LstmDims& dims, const LstmConfig& config, const LstmBackwardTensors<T>& tensors) {
  const bool any_output = tensors.dX || tensors.dW || tensors.dR || tensors.dB || tensors.dH0 || tensors.dC0 ||
                          tensors.dP;
  if (!any_output) return;
  const int64_t hidden = dims.hidden_size;
  // Scratch, sized once per call and reused by both directions.
  std::vector<T> grad_gates(static_cast<size_t>(dims.Rows() * dims.GateWidth()));
  std::vector<T> hidden_prev(static_cast<size_t>(dims.Rows() * hidden));
  std::vector<T> grad_h(static_cast<size_t>(dims.batch_size * hidden));
  std::vector<T> grad_c(static_cast<size_t>(dims.batch_size * hidden));
  const DirectionScratch<T> scratch{grad_gates.data(), hidden_prev.data(), grad_h.data(), grad_c.data()};
  for (int64_t d = 0; d < dims.num_directions; ++d) {
    BackwardDirection(dims, config, tensors, d, scratch, /*accumulate_dx=*/d > 0);
  }
}

template void LstmBackward<float>(const LstmDims&, const LstmConfig&, const LstmBackwardTensors<float>&);
template void LstmBackward<double>(const LstmDims&, const LstmConfig&, const LstmBackwardTensors<double>&);

}  // namespace ortlstm
