// LSTM forward for LSTMTraining: one GEMM projects X for all steps, then each step adds the
// recurrent term and runs the fused pointwise pass (bias, peepholes, clip, activations, state
// update, HAll/CAll/IOFC). The time loop runs as executor tasks (SplitTimeLoop, lstm_math.h): with
// enough batch entries each task takes a group of them through every step, its rows times all of
// R, so the whole loop is one round of tasks; otherwise each step is cut into blocks of hidden
// units, each task doing the recurrent GEMM for its block's four gate columns and then the block's
// pointwise work, one round of tasks per step. The two directions of a bidirectional LSTM run as
// two tasks when the executor has the width. Layouts: lstm/lstm_dims.h.
//
//   i = f(Xt Wi^T + Ht-1 Ri^T + Pi . Ct-1 + Wbi + Rbi)      (. = elementwise, clip before f/g)
//   f = f(Xt Wf^T + Ht-1 Rf^T + Pf . Ct-1 + Wbf + Rbf)      (input_forget: f = 1 - i)
//   c = g(Xt Wc^T + Ht-1 Rc^T + Wbc + Rbc)
//   Ct = f . Ct-1 + i . c
//   o = f(Xt Wo^T + Ht-1 Ro^T + Po . Ct + Wbo + Rbo)
//   Ht = o . h(Ct)
#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "common/blas.h"
#include "lstm/gate_math.h"
#include "lstm/lstm_math.h"

namespace ortlstm {
namespace {

// Scratch of one direction, allocated once per call.
template <typename T>
struct ForwardScratch {
  Scratch<T> gates;   // [T*N, 4H] X row order: pre-activations, activated in place; none when
                      // IOFC holds them (ForwardDirection::gates_in_iofc_)
  Scratch<T> hidden;  // [2, N, H] H_{t-1} and H_t, swapped every step
  Scratch<T> cell;    // [N, H] C, updated in place (each entry and unit by one task)
  Scratch<T> bias;    // [4H] Wb + Rb, block-major gate order (below)
  // W and R with their rows in block-major gate order, when a step is cut into several blocks.
  Scratch<T> W;  // [4H, I]
  Scratch<T> R;  // [4H, H]
  ForwardScratch(const LstmDims& dims, int64_t blocks, bool gates_in_iofc, const ScratchAllocator& allocator)
      : gates(allocator, gates_in_iofc ? 0 : dims.Rows() * dims.GateWidth()),
        hidden(allocator, 2 * dims.batch_size * dims.hidden_size),
        cell(allocator, dims.batch_size * dims.hidden_size),
        bias(allocator, dims.GateWidth()),
        W(allocator, blocks > 1 ? dims.GateWidth() * dims.input_size : 0),
        R(allocator, blocks > 1 ? dims.GateWidth() * dims.hidden_size : 0) {}
};

// The gate columns of the scratch are block-major: a step is cut into blocks of hidden units
// [u0, u1), and block k's columns are [4*u0, 4*u1), holding i, o, f, c of its units in turn.
// With one block this is the iofc order of W, R and IOFC; with several, W and R are copied with
// their rows in this order, so each block's recurrent GEMM is one call over contiguous columns.
template <typename T>
class ForwardDirection {
 public:
  ForwardDirection(const LstmDims& dims, const LstmConfig& config, const LstmForwardTensors<T>& io, int64_t d,
                   StepSplit split, const ScratchAllocator& allocator)
      : dims_(dims),
        config_(config),
        io_(io),
        d_(d),
        hidden_size_(dims.hidden_size),
        width_(dims.GateWidth()),
        split_(split),
        P_(io.P ? io.P + d * 3 * hidden_size_ : nullptr),
        f_act_(config.activations[d].f),
        g_act_(config.activations[d].g),
        h_act_(config.activations[d].h),
        standard_cell_(UsesStandardCell(config, d, P_ != nullptr)),
        gates_in_iofc_(io.IOFC != nullptr && dims.num_directions == 1 && split.unit_blocks == 1),
        scratch_(dims, split.unit_blocks, gates_in_iofc_, allocator),
        gates_(gates_in_iofc_ ? io.IOFC : scratch_.gates.get()) {
    const T* W = io.W + d * width_ * dims.input_size;
    const T* R = io.R + d * width_ * hidden_size_;
    W_ = W;
    R_ = R;
    T* bias = scratch_.bias.get();
    for (int64_t row = 0; row < width_; ++row) {
      const int64_t to = BlockMajorRow(row);
      bias[to] = io.B ? io.B[d * 2 * width_ + row] + io.B[d * 2 * width_ + width_ + row] : T(0);
      if (split_.unit_blocks > 1) {
        std::copy_n(W + row * dims.input_size, dims.input_size, scratch_.W.get() + to * dims.input_size);
        std::copy_n(R + row * hidden_size_, hidden_size_, scratch_.R.get() + to * hidden_size_);
      }
    }
    if (split_.unit_blocks > 1) {
      W_ = scratch_.W.get();
      R_ = scratch_.R.get();
    }
  }

  // gates [T*N, 4H] = X [T*N, I] * W^T: M = T*N, N = 4H, K = I, B transposed.
  void ProjectInputs(const Executor& executor) {
    ParallelGemm(executor, false, true, dims_.Rows(), width_, dims_.input_size, T(1), io_.X, dims_.input_size, W_,
                 dims_.input_size, T(0), gates_, width_);
  }

  void Run(const Executor& executor) {
    const int64_t batch_size = dims_.batch_size;
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
    // Each task's rows of R (its block's, or all of them for its group of entries), packed once
    // for the rows x 4*units x H GEMM of every step.
    std::vector<PackedGemmB<T>> recurrent(static_cast<size_t>(split_.Tasks()));
    executor.For(recurrent.size(), [&](size_t k) {
      const Range units = split_.Units(hidden_size_, static_cast<int64_t>(k));
      const Range rows = split_.Rows(batch_size, static_cast<int64_t>(k));
      if (units.end > units.begin && rows.end > rows.begin) {
        recurrent[k] = PackedGemmB<T>(true, rows.end - rows.begin, 4 * (units.end - units.begin), hidden_size_,
                                      R_ + 4 * units.begin * hidden_size_, hidden_size_);
      }
    });
    const bool reverse = config_.IsReverse(d_);
    const int64_t steps = dims_.seq_length;
    const int64_t per_round = split_.StepsPerRound(steps);
    for (int64_t first = 0; first < steps; first += per_round) {
      executor.For(recurrent.size(), [&](size_t k) {
        const auto task = static_cast<int64_t>(k);
        const Range units = split_.Units(hidden_size_, task);
        const Range rows = split_.Rows(batch_size, task);
        for (int64_t s = first; s < std::min(first + per_round, steps); ++s) {
          Step(reverse ? steps - 1 - s : s, units, rows, recurrent[k], h + (s % 2) * batch_size * hidden_size_,
               h + ((s + 1) % 2) * batch_size * hidden_size_);
        }
      });
    }
    WriteFinalState(h + (dims_.seq_length % 2) * batch_size * hidden_size_);
  }

 private:
  // Row of W/R (iofc order) -> its row in the block-major order.
  int64_t BlockMajorRow(int64_t row) const {
    const int64_t gate = row / hidden_size_;
    const int64_t unit = row % hidden_size_;
    // The block holding `unit`: SplitRange gives the first `extra` blocks one more unit.
    const int64_t base = hidden_size_ / split_.unit_blocks;
    const int64_t extra = hidden_size_ % split_.unit_blocks;
    const int64_t k = unit < extra * (base + 1) ? unit / (base + 1) : extra + (unit - extra * (base + 1)) / base;
    const Range units = SplitRange(hidden_size_, split_.unit_blocks, k);
    return 4 * units.begin + gate * (units.end - units.begin) + (unit - units.begin);
  }

  // One step of one task: hidden units [units.begin, units.end) (a block, block-major columns) of
  // batch entries [rows.begin, rows.end).
  void Step(int64_t t, Range units, Range rows, const PackedGemmB<T>& recurrent, const T* h_prev, T* h_next) {
    const int64_t hidden = hidden_size_;
    const int64_t count = units.end - units.begin;
    if (count <= 0 || rows.end <= rows.begin) return;
    T* step_gates = gates_ + dims_.XRow(t, rows.begin) * width_ + 4 * units.begin;
    const int64_t step_ld = dims_.BatchStride() * width_;
    // gates[rows, block] += H_{t-1}[rows] * R[block rows, :]^T: M = rows, N = 4*(u1-u0), K = H, B transposed.
    recurrent.Multiply(h_prev + rows.begin * hidden, hidden, T(1), step_gates, step_ld);
    for (int64_t b = rows.begin; b < rows.end; ++b) {
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
      T* gates = gates_ + dims_.XRow(t, b) * width_ + 4 * units.begin;
      T* cell = scratch_.cell.get() + b * hidden;
      // The activated gates go to IOFC too (in its iofc column order) unless IOFC holds `gates`.
      const bool copy_to_iofc = io_.IOFC != nullptr && !gates_in_iofc_;
      if (standard_cell_) {  // writes IOFC's gates itself
        StandardCellRow<T> row{gates, scratch_.bias.get() + 4 * units.begin, {}, cell + units.begin, h_out};
        for (int64_t g = 0; g < 4 && copy_to_iofc; ++g) {
          row.gate[g] = io_.IOFC + seq_row * width_ + g * hidden + units.begin;
        }
        StandardCellForward(row, count);
      } else {
        Cell(gates, cell, h_out, units);
        for (int64_t g = 0; g < 4 && copy_to_iofc; ++g) {
          std::copy_n(gates + g * count, count, io_.IOFC + seq_row * width_ + g * hidden + units.begin);
        }
      }
      if (io_.HAll) std::copy_n(h_out, count, io_.HAll + seq_row * hidden + units.begin);
      if (io_.CAll) std::copy_n(cell + units.begin, count, io_.CAll + seq_row * hidden + units.begin);
    }
  }

  // The pointwise part of one step for one batch entry and one block of units: `gates` [4*count]
  // (block-major: i, o, f, c of the block) holds X W^T + H R^T and is activated in place; `cell` [H]
  // holds C_{t-1} and becomes C_t; h_out[0, count) gets H_t.
  void Cell(T* gates, T* cell, T* h_out, Range units) const {
    const int64_t hidden = hidden_size_;
    const int64_t count = units.end - units.begin;
    const T* bias = scratch_.bias.get() + 4 * units.begin;
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
  const StepSplit split_;  // how the time loop is cut into tasks
  const T* P_;  // [3H] of this direction, or null
  const Activation f_act_;
  const Activation g_act_;
  const Activation h_act_;
  // Default activations, no clip, peepholes or input_forget: the fused StandardCellForward.
  const bool standard_cell_;
  // One direction and one block: X's row order is IOFC's and the block-major columns are its
  // iofc order, so IOFC itself holds the pre-activations and the cell activates them in place
  // (no [T*N, 4H] scratch, and the stash is written while it is in cache).
  const bool gates_in_iofc_;
  ForwardScratch<T> scratch_;
  T* const gates_;  // [T*N, 4H] pre-activations: IOFC or scratch_.gates
  const T* W_ = nullptr;  // [4H, I] of this direction, block-major rows
  const T* R_ = nullptr;  // [4H, H] of this direction, block-major rows
};

}  // namespace

template <typename T>
void LstmForward(const LstmDims& dims, const LstmConfig& config, const LstmForwardTensors<T>& tensors,
                 const Executor& executor, const ScratchAllocator& allocator) {
  // The recurrences of two directions are independent: one task each, serial inside.
  const bool directions_in_parallel = dims.num_directions == 2 && executor.Width() >= 2;
  const SerialExecutor serial;
  const Executor& step_executor = directions_in_parallel ? static_cast<const Executor&>(serial) : executor;
  const StepSplit split = SplitTimeLoop<T>(dims, step_executor, L2CacheBytes());
  ForwardDirection<T> forward(dims, config, tensors, 0, split, allocator);
  std::unique_ptr<ForwardDirection<T>> backward;
  if (dims.num_directions == 2) {
    backward = std::make_unique<ForwardDirection<T>>(dims, config, tensors, 1, split, allocator);
  }

  forward.ProjectInputs(executor);
  if (backward) backward->ProjectInputs(executor);
  if (directions_in_parallel) {
    executor.For(2, [&](size_t d) { (d == 0 ? forward : *backward).Run(serial); });
  } else {
    forward.Run(executor);
    if (backward) backward->Run(executor);
  }
}

template void LstmForward<float>(const LstmDims&, const LstmConfig&, const LstmForwardTensors<float>&,
                                 const Executor&, const ScratchAllocator&);
template void LstmForward<double>(const LstmDims&, const LstmConfig&, const LstmForwardTensors<double>&,
                                  const Executor&, const ScratchAllocator&);

}  // namespace ortlstm
