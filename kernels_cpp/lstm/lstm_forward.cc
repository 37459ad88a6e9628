// LSTM forward for LSTMTraining: one GEMM projects X for all steps, one GEMM per step adds the
// recurrent term for the whole batch, and a fused pointwise pass applies bias, peepholes, clip
// and activations, updates the state and writes HAll, CAll and the activated gates (IOFC).
// Layouts: lstm/lstm_dims.h.
//
//   i = f(Xt Wi^T + Ht-1 Ri^T + Pi . Ct-1 + Wbi + Rbi)      (. = elementwise, clip before f/g)
//   f = f(Xt Wf^T + Ht-1 Rf^T + Pf . Ct-1 + Wbf + Rbf)      (input_forget: f = 1 - i)
//   c = g(Xt Wc^T + Ht-1 Rc^T + Wbc + Rbc)
//   Ct = f . Ct-1 + i . c
//   o = f(Xt Wo^T + Ht-1 Ro^T + Po . Ct + Wbo + Rbo)
//   Ht = o . h(Ct)
#include <algorithm>
#include <cstring>
#include <vector>

#include "common/blas.h"
#include "lstm/gate_math.h"
#include "lstm/lstm_math.h"

namespace ortlstm {
namespace {

template <typename T>
void ForwardDirection(const LstmDims& dims, const LstmConfig& config, const LstmForwardTensors<T>& io, int64_t d,
                      T* gates, T* h_state, T* c_state, T* bias) {
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
  const bool has_clip = config.clip.has_value();
  const T clip = has_clip ? static_cast<T>(*config.clip) : T(0);

  // bias [4H] = Wb + Rb, iofc.
  for (int64_t j = 0; j < width; ++j) {
    bias[j] = io.B ? io.B[d * 2 * width + j] + io.B[d * 2 * width + width + j] : T(0);
  }
  // gates [T*N, 4H] = X [T*N, I] * W^T: M = T*N, N = 4H, K = I, B transposed.
  Gemm(false, true, dims.Rows(), width, input_size, T(1), io.X, input_size, W, input_size, T(0), gates, width);

  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t state = dims.StateRow(d, b);
    T* h = h_state + b * hidden;
    T* c = c_state + b * hidden;
    if (io.initial_h) {
      std::copy_n(io.initial_h + state * hidden, hidden, h);
    } else {
      std::fill_n(h, hidden, T(0));
    }
    if (io.initial_c) {
      std::copy_n(io.initial_c + state * hidden, hidden, c);
    } else {
      std::fill_n(c, hidden, T(0));
    }
  }

  const int64_t step_ld = dims.BatchStride() * width;  // rows of one step in `gates`
  for (int64_t s = 0; s < seq_length; ++s) {
    const int64_t t = reverse ? seq_length - 1 - s : s;
    T* step_gates = gates + dims.XRow(t, 0) * width;
    // step_gates [N, 4H] += h_state [N, H] * R^T: M = N, N = 4H, K = H, B transposed.
    Gemm(false, true, batch_size, width, hidden, T(1), h_state, hidden, R, hidden, T(1), step_gates, step_ld);

    for (int64_t b = 0; b < batch_size; ++b) {
      const int64_t seq_row = dims.SeqRow(t, d, b);
      const bool active = io.sequence_lens == nullptr || t < io.sequence_lens[b];
      if (!active) {
        if (io.HAll) std::fill_n(io.HAll + seq_row * hidden, hidden, T(0));
        if (io.CAll) std::fill_n(io.CAll + seq_row * hidden, hidden, T(0));
        if (io.IOFC) std::fill_n(io.IOFC + seq_row * width, width, T(0));
        continue;
      }
      T* pre = gates + dims.XRow(t, b) * width;  // [4H] pre-activations, iofc; activated in place
      T* h = h_state + b * hidden;
      T* c = c_state + b * hidden;
      for (int64_t j = 0; j < hidden; ++j) {
        const T c_prev = c[j];
        T pre_i = pre[j] + bias[j];
        T pre_o = pre[hidden + j] + bias[hidden + j];
        T pre_f = pre[2 * hidden + j] + bias[2 * hidden + j];
        T pre_c = pre[3 * hidden + j] + bias[3 * hidden + j];
        if (P) {
          pre_i += Pi[j] * c_prev;
          pre_f += Pf[j] * c_prev;
        }
        if (has_clip) {
          pre_i = ClipTo(pre_i, clip);
          pre_f = ClipTo(pre_f, clip);
          pre_c = ClipTo(pre_c, clip);
        }
        const T gate_i = Apply<T>(f_act.act, pre_i);
        const T gate_f = config.input_forget ? T(1) - gate_i : Apply<T>(f_act.act, pre_f);
        const T gate_c = Apply<T>(g_act.act, pre_c);
        const T cell = gate_f * c_prev + gate_i * gate_c;
        if (P) pre_o += Po[j] * cell;
        if (has_clip) pre_o = ClipTo(pre_o, clip);
        const T gate_o = Apply<T>(f_act.act, pre_o);
        const T hidden_out = gate_o * Apply<T>(h_act, cell);
        pre[j] = gate_i;
        pre[hidden + j] = gate_o;
        pre[2 * hidden + j] = gate_f;
        pre[3 * hidden + j] = gate_c;
        c[j] = cell;
        h[j] = hidden_out;
      }
      if (io.HAll) std::copy_n(h, hidden, io.HAll + seq_row * hidden);
      if (io.CAll) std::copy_n(c, hidden, io.CAll + seq_row * hidden);
      if (io.IOFC) std::copy_n(pre, width, io.IOFC + seq_row * width);
    }
  }

  // An entry that ran no step reports a zero final state, not its initial state (as onnxruntime's
  // LSTM does), so nothing flows back from Ht/Ct into initial_h/initial_c for it.
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t state = dims.StateRow(d, b);
    const bool ran = seq_length > 0 && (io.sequence_lens == nullptr || io.sequence_lens[b] > 0);
    if (io.Ht) {
      if (ran) {
        std::copy_n(h_state + b * hidden, hidden, io.Ht + state * hidden);
      } else {
        std::fill_n(io.Ht + state * hidden, hidden, T(0));
      }
    }
    if (io.Ct) {
      if (ran) {
        std::copy_n(c_state + b * hidden, hidden, io.Ct + state * hidden);
      } else {
        std::fill_n(io.Ct + state * hidden, hidden, T(0));
      }
    }
  }
}

}  // namespace

template <typename T>
void LstmForward(const LstmDims& dims, const LstmConfig& config, const LstmForwardTensors<T>& tensors) {
  const int64_t hidden = dims.hidden_size;
  const int64_t width = dims.GateWidth();
  // Scratch, sized once per call and reused by both directions.
  std::vector<T> gates(static_cast<size_t>(dims.Rows() * width));  // [T*N, 4H], X row order
  std::vector<T> h_state(static_cast<size_t>(dims.batch_size * hidden));  // [N, H]
  std::vector<T> c_state(static_cast<size_t>(dims.batch_size * hidden));  // [N, H]
  std::vector<T> bias(static_cast<size_t>(width));                        // [4H]
  for (int64_t d = 0; d < dims.num_directions; ++d) {
    ForwardDirection(dims, config, tensors, d, gates.data(), h_state.data(), c_state.data(), bias.data());
  }
}

template void LstmForward<float>(const LstmDims&, const LstmConfig&, const LstmForwardTensors<float>&);
template void LstmForward<double>(const LstmDims&, const LstmConfig&, const LstmForwardTensors<double>&);

}  // namespace ortlstm
