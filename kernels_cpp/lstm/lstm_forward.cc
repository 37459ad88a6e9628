// LSTM forward for LSTMTraining: the recurrent family's first cell policy (LstmForwardCell) on the
// shared time loop (recurrent/forward_driver.h), which projects X for all steps, adds each step's
// recurrent term H_{t-1} R^T into the gates (one stage, accumulated) and cuts the loop into tasks
// (groups of batch entries, or blocks of hidden units with block-major gate columns: i, o, f, c of
// a block in turn). The cell runs the fused pointwise pass (bias, peepholes, clip, activations,
// state update, CAll/IOFC) and owns C. Layouts: lstm/lstm_dims.h.
//
//   i = f(Xt Wi^T + Ht-1 Ri^T + Pi . Ct-1 + Wbi + Rbi)      (. = elementwise, clip before f/g)
//   f = f(Xt Wf^T + Ht-1 Rf^T + Pf . Ct-1 + Wbf + Rbf)      (input_forget: f = 1 - i)
//   c = g(Xt Wc^T + Ht-1 Rc^T + Wbc + Rbc)
//   Ct = f . Ct-1 + i . c
//   o = f(Xt Wo^T + Ht-1 Ro^T + Po . Ct + Wbo + Rbo)
//   Ht = o . h(Ct)
#include <algorithm>
#include <memory>

#include "lstm/gate_math.h"
#include "lstm/lstm_math.h"
#include "recurrent/forward_driver.h"

namespace ortlstm {
namespace {

// The LSTM cell of one direction: the bias Wb + Rb in block-major gate order, C, and the pointwise
// pass of a block of units of one batch entry.
template <typename T>
class LstmForwardCell {
 public:
  static constexpr int64_t kGates = 4;
  static constexpr bool kAccumulate = true;  // H R^T adds into the projected gates

  LstmForwardCell(const LstmDims& dims, const LstmConfig& config, const LstmForwardTensors<T>& io, int64_t d,
                  StepSplit split, const ScratchAllocator& allocator)
      : dims_(dims),
        config_(config),
        io_(io),
        d_(d),
        hidden_size_(dims.hidden_size),
        width_(dims.GateWidth()),
        P_(io.P ? io.P + d * 3 * hidden_size_ : nullptr),
        f_act_(config.activations[d].f),
        g_act_(config.activations[d].g),
        h_act_(config.activations[d].h),
        standard_cell_(UsesStandardCell(config, d, P_ != nullptr)),
        cell_(allocator, dims.batch_size * dims.hidden_size),
        bias_(allocator, dims.GateWidth()) {
    T* bias = bias_.get();
    for (int64_t row = 0; row < width_; ++row) {
      const int64_t to = BlockMajorRow(row, kGates, hidden_size_, split.unit_blocks);
      bias[to] = io.B ? io.B[d * 2 * width_ + row] + io.B[d * 2 * width_ + width_ + row] : T(0);
    }
  }

  int64_t Stages() const { return 1; }
  Range StageGates(int64_t) const { return Range{0, kGates}; }
  const T* StageInput(int64_t) const { return nullptr; }
  T* StageOutput(int64_t) const { return nullptr; }

  void InitialState(int64_t b) {
    T* c = cell_.get() + b * hidden_size_;
    if (io_.initial_c) {
      std::copy_n(io_.initial_c + dims_.StateRow(d_, b) * hidden_size_, hidden_size_, c);
    } else {
      std::fill_n(c, hidden_size_, T(0));
    }
  }

  // A step past the entry's length: CAll and IOFC are zero there.
  void Inactive(int64_t, int64_t, int64_t seq_row, Range units) {
    const int64_t count = units.end - units.begin;
    if (io_.CAll) std::fill_n(io_.CAll + seq_row * hidden_size_ + units.begin, count, T(0));
    if (io_.IOFC) {
      for (int64_t g = 0; g < 4; ++g) {
        std::fill_n(io_.IOFC + seq_row * width_ + g * hidden_size_ + units.begin, count, T(0));
      }
    }
  }

  void Pointwise(int64_t, int64_t, int64_t b, Range units, const ForwardRow<T>& row) {
    const int64_t hidden = hidden_size_;
    const int64_t count = units.end - units.begin;
    T* cell = cell_.get() + b * hidden;
    const int64_t seq_row = row.seq_row;
    // The activated gates go to IOFC too (in its iofc column order) unless IOFC holds `gates`.
    const bool copy_to_iofc = io_.IOFC != nullptr && !row.gates_in_stash;
    if (standard_cell_) {  // writes IOFC's gates itself
      StandardCellRow<T> cell_row{row.gates, bias_.get() + 4 * units.begin, {}, cell + units.begin, row.h_out};
      for (int64_t g = 0; g < 4 && copy_to_iofc; ++g) {
        cell_row.gate[g] = io_.IOFC + seq_row * width_ + g * hidden + units.begin;
      }
      StandardCellForward(cell_row, count);
    } else {
      Cell(row.gates, cell, row.h_out, units);
      for (int64_t g = 0; g < 4 && copy_to_iofc; ++g) {
        std::copy_n(row.gates + g * count, count, io_.IOFC + seq_row * width_ + g * hidden + units.begin);
      }
    }
    if (io_.CAll) std::copy_n(cell + units.begin, count, io_.CAll + seq_row * hidden + units.begin);
  }

  // Ct of an entry that ran no step is zero, as Ht is (the driver's WriteFinalState).
  void FinalState(int64_t b, bool ran) {
    if (!io_.Ct) return;
    const int64_t state = dims_.StateRow(d_, b) * hidden_size_;
    if (ran) {
      std::copy_n(cell_.get() + b * hidden_size_, hidden_size_, io_.Ct + state);
    } else {
      std::fill_n(io_.Ct + state, hidden_size_, T(0));
    }
  }

 private:
  // The pointwise part of one step for one batch entry and one block of units: `gates` [4*count]
  // (block-major: i, o, f, c of the block) holds X W^T + H R^T and is activated in place; `cell` [H]
  // holds C_{t-1} and becomes C_t; h_out[0, count) gets H_t.
  void Cell(T* gates, T* cell, T* h_out, Range units) const {
    const int64_t hidden = hidden_size_;
    const int64_t count = units.end - units.begin;
    const T* bias = bias_.get() + 4 * units.begin;
    T* gi = gates;
    T* go = gates + count;
    T* gf = gates + 2 * count;
    T* gc = gates + 3 * count;
    T* c = cell + units.begin;
    for (int64_t j = 0; j < 4 * count; ++j) gates[j] += bias[j];
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

  const LstmDims& dims_;
  const LstmConfig& config_;
  const LstmForwardTensors<T>& io_;
  const int64_t d_;
  const int64_t hidden_size_;
  const int64_t width_;
  const T* P_;  // [3H] of this direction, or null
  const Activation f_act_;
  const Activation g_act_;
  const Activation h_act_;
  // Default activations, no clip, peepholes or input_forget: the fused StandardCellForward.
  const bool standard_cell_;
  Scratch<T> cell_;  // [N, H] C, updated in place (each entry and unit by one task)
  Scratch<T> bias_;  // [4H] Wb + Rb, block-major gate order
};

}  // namespace

template <typename T>
void LstmForward(const LstmDims& dims, const LstmConfig& config, const LstmForwardTensors<T>& tensors,
                 const Executor& executor, const ScratchAllocator& allocator) {
  const ForwardIo<T> io = ForwardIoOf<T>(tensors, tensors.IOFC, config.matmul_precision);
  RunForward<T, LstmForwardCell<T>>(dims, io, {config.IsReverse(0), config.IsReverse(1)}, executor, allocator,
                                    [&](int64_t d, StepSplit split) {
                                      return std::make_unique<LstmForwardCell<T>>(dims, config, tensors, d, split,
                                                                                  allocator);
                                    });
}

template void LstmForward<float>(const LstmDims&, const LstmConfig&, const LstmForwardTensors<float>&,
                                 const Executor&, const ScratchAllocator&);
template void LstmForward<double>(const LstmDims&, const LstmConfig&, const LstmForwardTensors<double>&,
                                  const Executor&, const ScratchAllocator&);

}  // namespace ortlstm
