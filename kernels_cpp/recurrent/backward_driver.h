// The recurrent family's backward time loop, shared by every cell (LSTM: lstm/lstm_backward.cc,
// GRU: gru/gru_backward.cc, RNN: rnn/rnn_backward.cc) and templated on a cell policy, as the
// forward is (recurrent/forward_driver.h). Everything is read from the stash (no forward re-run),
// so only dL/dH (and a cell's own carried state, the LSTM's dL/dC) runs through the time loop.
//
// The driver owns what does not depend on the cell: dL/dH at the last step and dH0; the reverse
// time loop cut into executor tasks (SplitTimeLoop, lstm/lstm_math.h: groups of batch entries,
// each through all of a window's steps, or blocks of hidden units, one phase of tasks per step,
// a window's phases inside one round of the executor: ForPhases, common/parallel.h);
// per step, the carry GEMM that takes the later step's gradient rows back through R into the
// task's part of dH; keeping the gate gradients for a window of steps at a time, each finished
// window adding its share of dW and dX (GEMMs with K = the window's rows); the dB sums, per group
// of entries, added in group order; the two directions (in parallel when a step is too small to
// split, or the cell asks: BackwardTasks); X zeroed past each sequence's length for dW. Every
// split is fixed by the shapes and the executor's width, so the result does not depend on
// scheduling. Layouts: lstm/lstm_dims.h, with `gates` = the cell's kGates; gate gradients
// [.., G*H] are gate-major (gate * H + unit).
//
// A cell policy (one object per direction, built on the direction's BackwardLoop) provides:
//   static constexpr int64_t kGates;   gate columns per hidden unit (LSTM 4, GRU 3, RNN 1)
//   int64_t CarryDepth() const;        K of the carry GEMM dH_{t-1}[rows, units] += C_t[rows, :K] R[:K, units]
//   const T* CarryRow(int64_t t) const;  row (t, entry 0) of C_t, rows BatchStride() * G*H apart
//                                        (the window's gate gradients, or a window of its own)
//   void InitialGradState(int64_t b, bool ran);  its own carried state's gradient at the last step
//   void BeginWindow(int64_t lo, int64_t hi, const Executor&);  before the window of times [lo, hi)
//   void Inactive(int64_t t, int64_t b, Range units);  its own window rows of a step past b's length
//                                                      (the driver zeroes the gate gradients)
//   void Step(int64_t t, Range units, Range rows, int64_t task);  the pointwise pass of step t for
//       the active entries of `rows`: from dL/dH_t (loop.GradH(): the carried part) the gate
//       gradients of its units, and GradH() left as the part of dL/dH_{t-1} that does not go
//       through R (the carry GEMM adds the rest before step t-1)
//   bool SeparateRecurrentBias() const;  whether dRb is not dWb (the sum of the gate gradients):
//   const T* RecurrentBiasRow(int64_t t, int64_t b) const;  then the row whose sum is dRb (GRU,
//       linear_before_reset = 1)
//   void AddWindowGradients(int64_t lo, int64_t hi, bool first, const Executor&);  the window's
//       share of dR and of any weight of its own (the LSTM's dP); `first` starts the sums
//   void FinalGradState(int64_t b);    its own initial state's gradient (dC0)
// and the caller tells RunBackward how its loop may be cut (BackwardTasks).
#pragma once

#include <algorithm>
#include <array>
#include <memory>
#include <vector>

#include "common/blas.h"
#include "common/scratch.h"
#include "lstm/lstm_math.h"
#include "lstm/vector_loops.h"
#include "recurrent/recurrent_gemm.h"
#include "recurrent/recurrent_io.h"

namespace ortlstm {

// Groups of batch entries are taken while R is at most this size (SplitTimeLoop), whatever the
// L2 cache: each step multiplies by R untransposed (K = G*H), and on AMD Zen 3 (512 KB of L2,
// the LSTM's R of 1 MiB at M) blocks of units were no faster than groups there (M bwd 28.1 vs
// 28.2 ms, M-bidir 56.2 vs 55.0 ms), unlike the forward's. 2 MiB is the L2 of the Intel VM it was
// tuned on.
constexpr int64_t kMaxBackwardGroupWeightBytes = int64_t{2} << 20;

// How a cell's backward time loop may be cut into tasks (RunBackward).
struct BackwardTasks {
  // A step may be cut into blocks of hidden units: not when the pointwise pass needs a whole row
  // of gate gradients before a GEMM of its own (the GRU with linear_before_reset = 0:
  // d(r . H_{t-1}) = da Rh), which then takes groups of entries only.
  bool unit_blocks = true;
  // Two directions run as two tasks whenever the executor has the width, not only when a step is
  // too small to split (BackwardDirectionsInParallel).
  bool directions_first = false;
  // The gate gradients are kept for windows of steps (BackwardDriver::ChunkSteps), else for the
  // whole sequence at once.
  bool windows = true;
};

// The driver's tensors of one call (all directions); optional ones are nullptr.
template <typename T>
struct BackwardIo : RecurrentInputs<T> {
  const T* HAll = nullptr;
  const T* grad_Ht = nullptr;
  T* dX = nullptr;
  T* dW = nullptr;
  T* dB = nullptr;  // [D, 2*G*H]
  T* dH0 = nullptr;
};

// The driver's tensors from a cell's backward tensors (LstmBackwardTensors, ...).
template <typename T, typename Tensors>
BackwardIo<T> BackwardIoOf(const Tensors& tensors, MatmulPrecision precision) {
  BackwardIo<T> io;
  io.TakeInputs(tensors, precision);
  io.HAll = tensors.HAll;
  io.grad_Ht = tensors.grad_Ht;
  io.dX = tensors.dX;
  io.dW = tensors.dW;
  io.dB = tensors.dB;
  io.dH0 = tensors.dH0;
  return io;
}

// One direction's loop state that a cell policy reads: the window of gate gradients, dL/dH and
// the index arithmetic of the steps. The window holds `chunk` steps; with one window (chunk =
// seq_length) its rows are in X's row order, so that whole-sequence GEMMs need no copies.
template <typename T>
class BackwardLoop {
 public:
  BackwardLoop(const LstmDims& dims, const BackwardIo<T>& io, int64_t d, bool reverse, StepSplit split, int64_t chunk,
               const ScratchAllocator& allocator)
      : dims(dims),
        io(io),
        d(d),
        reverse(reverse),
        split(split),
        chunk(std::max<int64_t>(chunk, 1)),
        hidden(dims.hidden_size),
        width(dims.GateWidth()),
        grad_gates_(allocator, this->chunk * dims.batch_size * width),
        grad_h_(allocator, dims.batch_size * hidden) {}

  const LstmDims& dims;
  const BackwardIo<T>& io;
  const int64_t d;
  const bool reverse;
  const StepSplit split;  // how the time loop is cut into tasks
  const int64_t chunk;    // steps per window of gate gradients
  const int64_t hidden;
  const int64_t width;  // G*H

  // Rows of one window: chunk * N.
  int64_t WindowRows() const { return chunk * dims.batch_size; }
  int64_t Length(int64_t b) const { return io.sequence_lens ? io.sequence_lens[b] : dims.seq_length; }
  bool Active(int64_t t, int64_t b) const { return t < Length(b); }
  // The step before t in processing order, or -1 when t is the first step of entry b.
  int64_t PreviousStep(int64_t t, int64_t b) const {
    if (reverse) return t + 1 < Length(b) ? t + 1 : -1;
    return t - 1;
  }
  // H_{t-1} [H] as step t of entry b saw it: HAll of its previous step, initial_h, or nullptr
  // (zeros: no initial_h).
  const T* HiddenBefore(int64_t t, int64_t b) const {
    const int64_t prev = PreviousStep(t, b);
    if (prev >= 0) return io.HAll + dims.SeqRow(prev, d, b) * hidden;
    return io.initial_h ? io.initial_h + dims.StateRow(d, b) * hidden : nullptr;
  }
  // Row (t, b) of the current window (of gate gradients, or of any [window rows, .] scratch).
  int64_t WindowRow(int64_t t, int64_t b) const {
    return dims.layout == 0 ? (t - window_lo) * dims.batch_size + b : dims.XRow(t, b);
  }
  T* GradRow(int64_t t, int64_t b) const { return grad_gates_.get() + WindowRow(t, b) * width; }
  const T* GradGates() const { return grad_gates_.get(); }
  // [N, H] dL/dH flowing into the step being processed (the carried part; grad_HAll is the cell's
  // to add).
  T* GradH() const { return grad_h_.get(); }

  int64_t window_lo = 0;  // the window's first time (lowest t); 0 with one window (X's row order)

 private:
  Scratch<T> grad_gates_;  // [chunk*N, G*H] dL/d(pre-activation) of the window's steps
  Scratch<T> grad_h_;      // [N, H]
};

// hidden_prev [window rows, H] <- H_{t-1} of each step of times [lo, hi) (zeros past an entry's
// length: its gate gradients are zero there): the rows a cell's dR multiplies. In tasks by
// entries, as this runs between the window's rounds with the other threads idle.
template <typename T>
void GatherHiddenPrev(const BackwardLoop<T>& loop, int64_t lo, int64_t hi, T* hidden_prev, const Executor& executor) {
  const int64_t H = loop.hidden;
  const int64_t batch = loop.dims.batch_size;
  const int64_t parts = std::max<int64_t>(std::min<int64_t>(executor.Width(), batch), 1);
  executor.For(static_cast<size_t>(parts), [&](size_t k) {
    const Range entries = SplitRange(batch, parts, static_cast<int64_t>(k));
    for (int64_t t = lo; t < hi; ++t) {
      for (int64_t b = entries.begin; b < entries.end; ++b) {
        T* out = hidden_prev + loop.WindowRow(t, b) * H;
        const T* state = loop.Active(t, b) ? loop.HiddenBefore(t, b) : nullptr;
        if (state) {
          std::copy_n(state, H, out);
        } else {
          std::fill_n(out, H, T(0));
        }
      }
    }
  });
}

template <typename T, typename Cell>
class BackwardDriver {
 public:
  static constexpr int64_t G = Cell::kGates;

  template <typename MakeCell>
  BackwardDriver(const LstmDims& dims, const BackwardIo<T>& io, int64_t d, bool reverse, StepSplit split,
                 int64_t chunk, const ScratchAllocator& allocator, const MakeCell& make_cell)
      : loop_(dims, io, d, reverse, split, chunk, allocator),
        cell_(make_cell(loop_)),
        separate_rbias_(cell_->SeparateRecurrentBias()),
        grad_bias_(allocator, split.row_groups * dims.GateWidth()),
        grad_rbias_(allocator, separate_rbias_ ? split.row_groups * dims.GateWidth() : 0),
        copy_carry_blocks_(split.unit_blocks > 1 && !UsesBf16<T>(io.precision)),
        carry_copy_(allocator, copy_carry_blocks_ ? cell_->CarryDepth() * dims.hidden_size : 0) {
    std::fill_n(grad_bias_.get(), split.row_groups * dims.GateWidth(), T(0));
    if (separate_rbias_) std::fill_n(grad_rbias_.get(), split.row_groups * dims.GateWidth(), T(0));
  }

  // Steps per window: enough rows (N per step) for the weight-gradient GEMMs of a window to run at
  // full speed, 512, and a single window when the steps cannot be windowed: layout 1 interleaves
  // the steps of all entries in X, and directions in parallel share dX, computed after both (or
  // when the cell asks for one window: !BackwardTasks::windows).
  static int64_t ChunkSteps(const LstmDims& dims, bool directions_in_parallel, bool windows) {
    constexpr int64_t kWindowRows = 512;
    if (dims.layout != 0 || directions_in_parallel || !windows || dims.batch_size == 0) return dims.seq_length;
    const int64_t steps = (kWindowRows + dims.batch_size - 1) / dims.batch_size;
    return steps < dims.seq_length ? steps : dims.seq_length;
  }

  // The gate gradients of the whole sequence, when they were kept in one window.
  const T* GradGates() const { return loop_.GradGates(); }

  // The reverse time loop, window by window: the gate gradients of each window's steps go into
  // the window, their column sums into the dB sums, and when the window is complete its share of
  // dW, the cell's dR (and own weights) and (with `input_grad`) dX is added. `x` is X with the
  // steps past each sequence's length zeroed (or X itself when every sequence is full).
  // `input_grad` is dX, accumulated into when `input_beta` is 1.
  void Recurrence(const Executor& executor, const T* x, T* input_grad, T input_beta) {
    const LstmDims& dims = loop_.dims;
    const BackwardIo<T>& io = loop_.io;
    const StepSplit split = loop_.split;
    const int64_t hidden = loop_.hidden;
    const int64_t d = loop_.d;
    T* gh = loop_.GradH();
    // Ht (and a cell's own final state) of an entry that ran no step are constant zeros (the
    // forward driver): their gradients stop.
    for (int64_t b = 0; b < dims.batch_size; ++b) {
      const bool ran = loop_.Length(b) > 0;
      if (ran && io.grad_Ht) {
        std::copy_n(io.grad_Ht + dims.StateRow(d, b) * hidden, hidden, gh + b * hidden);
      } else {
        std::fill_n(gh + b * hidden, hidden, T(0));
      }
      cell_->InitialGradState(b, ran);
    }
    // Task k owns hidden units `units` of entries `rows` (StepSplit). For each step, first
    //   dH_t[rows, units] += C_{t+1}[rows] [., K] * R[:K, units]  (M = rows, N = units, K),
    // which needs the task's rows of C_{t+1} at every unit (with blocks of units, the previous
    // round), then the cell's pointwise pass of step t, which needs only these entries of dH_t.
    // R is not packed here (unlike the forward's R^T): oneMKL runs this untransposed product as
    // fast from R itself (32 x 128 x 1024: 54 us plain, 59 us packed; 16 x 256 x 1024: no faster
    // packed in the kernel). `count` steps from processing step `first` run in one round; with
    // `carry` the round ends by carrying its last step into dH (for the next window's first step,
    // or dH0), which a task can do for its own rows only when it owns every unit of them.
    // Each task's R[:K, units] for the carry, once per op call (a bf16 operand rounds it here).
    // With blocks of units, a float one is first copied by its task into rows of its own block's
    // width: a one-row GEMM (OpenBLAS, AMD Zen 4) ran 25-35 % faster from dense rows than from
    // R's strided ones (GRU B1's 1 x 64 x 384: 1.02 vs 1.37 us, the LSTM's 1 x 64 x 512: 1.21 vs
    // 1.53), and the copy lands in the cache of the core that reads it every step.
    const int64_t depth = cell_->CarryDepth();
    std::vector<StepOperand<T>> carry_weights(static_cast<size_t>(split.Tasks()));
    executor.For(carry_weights.size(), [&](size_t k) {
      const Range units = split.Units(hidden, static_cast<int64_t>(k));
      const Range rows = split.Rows(dims.batch_size, static_cast<int64_t>(k));
      const int64_t count = units.end - units.begin;
      if (count <= 0 || rows.end <= rows.begin) return;
      const T* weight = io.R + d * loop_.width * hidden + units.begin;
      int64_t ld = hidden;
      if (copy_carry_blocks_) {
        T* block = carry_copy_.get() + depth * units.begin;  // [K, count], the blocks side by side
        for (int64_t j = 0; j < depth; ++j) std::copy_n(weight + j * hidden, count, block + j * count);
        weight = block;
        ld = count;
      }
      carry_weights[k] = StepOperand<T>(io.precision, false, false, rows.end - rows.begin, count, depth, weight, ld);
    });
    int64_t later_time = -1;  // the step processed last, until carried
    const int64_t steps = dims.seq_length;
    auto time_of = [&](int64_t p) { return loop_.reverse ? p : steps - 1 - p; };
    // A window's rounds of tasks: `count` steps from `first`, carried at the end with `carry`,
    // `later` the step processed just before (-1: none, or carried already).
    struct Round {
      int64_t first;
      int64_t count;
      bool carry;
      int64_t later;
    };
    std::vector<Round> rounds;
    auto add_round = [&](int64_t first, int64_t count, bool carry) {
      rounds.push_back(Round{first, count, carry, later_time});
      if (count > 0) later_time = time_of(first + count - 1);
      if (carry) later_time = -1;
    };
    for (int64_t first = 0; first < steps; first += loop_.chunk) {
      // Processing steps [first, last) are times [lo, hi) (the loop runs backwards in time unless
      // the direction is reversed).
      const int64_t last = std::min(first + loop_.chunk, steps);
      const int64_t lo = loop_.reverse ? first : steps - last;
      const int64_t hi = loop_.reverse ? last : steps - first;
      loop_.window_lo = lo;
      cell_->BeginWindow(lo, hi, executor);
      // The window's last step goes into dH before its GEMMs, so that the window can be reused:
      // inside the last round when each task owns whole rows, else in a round of its own.
      const bool carry = last < steps || io.dH0 != nullptr;
      const bool carry_in_round = split.unit_blocks == 1;
      const int64_t per_round = std::min(split.StepsPerRound(steps), last - first);
      rounds.clear();
      for (int64_t p = first; p < last; p += per_round) {
        const int64_t count = std::min(per_round, last - p);
        add_round(p, count, carry && carry_in_round && p + count == last);
      }
      if (carry && !carry_in_round) add_round(last, 0, true);
      // Each round is a phase of ForPhases: one executor round for the window's time loop.
      ForPhases(executor, static_cast<int64_t>(rounds.size()), split.Tasks(), [&](int64_t phase, int64_t task) {
        const Round& round = rounds[static_cast<size_t>(phase)];
        const Range units = split.Units(hidden, task);
        const Range rows = split.Rows(dims.batch_size, task);
        int64_t later = round.later;
        for (int64_t p = round.first; p < round.first + round.count; ++p) {
          CarryBack(later, units, rows, carry_weights[static_cast<size_t>(task)]);
          Step(time_of(p), units, rows, task);
          later = time_of(p);
        }
        if (round.carry) CarryBack(later, units, rows, carry_weights[static_cast<size_t>(task)]);
      });
      AddWindowGradients(lo, hi, first == 0, x, input_grad, input_beta, executor);
    }
    if (steps == 0) {  // zero sums
      cell_->BeginWindow(0, 0, executor);
      AddWindowGradients(0, 0, true, x, input_grad, input_beta, executor);
    }
    for (int64_t b = 0; b < dims.batch_size; ++b) {
      if (io.dH0) std::copy_n(gh + b * hidden, hidden, io.dH0 + dims.StateRow(d, b) * hidden);
      cell_->FinalGradState(b);
    }
  }

  // dB of this direction, from the finished recurrence: the column sums of the gate gradients to
  // the Wb half, and to the Rb half those of the cell's RecurrentBiasRow (or the same).
  void WriteBiasGradient() const {
    const BackwardIo<T>& io = loop_.io;
    if (!io.dB) return;
    const int64_t width = loop_.width;
    T* dB = io.dB + loop_.d * 2 * width;
    for (int64_t half = 0; half < (separate_rbias_ ? 2 : 1); ++half) {
      const T* sums = (half == 0 ? grad_bias_ : grad_rbias_).get();
      T* out = dB + half * width;
      std::copy_n(sums, width, out);
      for (int64_t g = 1; g < loop_.split.row_groups; ++g) {  // in group order, fixed by the shapes
        for (int64_t j = 0; j < width; ++j) out[j] += sums[g * width + j];
      }
    }
    if (!separate_rbias_) std::copy_n(dB, width, dB + width);
  }

 private:
  // dH_t[rows, units] += C_{t+1}[rows] [., K] * R[:K, units] (M = rows, N = units), C_{t+1} being
  // the cell's carry rows of the later step; nothing before the first step processed (-1).
  // `weight` is the task's R[:K, units] (Recurrence).
  void CarryBack(int64_t later, Range units, Range rows, const StepOperand<T>& weight) {
    if (later < 0 || units.end <= units.begin || rows.end <= rows.begin) return;
    const int64_t step_ld = loop_.dims.BatchStride() * loop_.width;
    weight.Multiply(cell_->CarryRow(later) + rows.begin * step_ld, step_ld, T(1),
                    loop_.GradH() + rows.begin * loop_.hidden + units.begin, loop_.hidden, rows.end - rows.begin);
  }

  // Step t for hidden units `units` of entries `rows`: zero gate gradients past an entry's length
  // (its dH passes through), the cell's pointwise pass, then the dB sums: this task owns these
  // columns of its group's sums at every step, so it adds them without a second pass.
  void Step(int64_t t, Range units, Range rows, int64_t task) {
    const int64_t hidden = loop_.hidden;
    const int64_t count = units.end - units.begin;
    if (count <= 0) return;
    for (int64_t b = rows.begin; b < rows.end; ++b) {
      if (loop_.Active(t, b)) continue;
      T* grad = loop_.GradRow(t, b);
      for (int64_t g = 0; g < G; ++g) std::fill_n(grad + g * hidden + units.begin, count, T(0));
      cell_->Inactive(t, b, units);
    }
    cell_->Step(t, units, rows, task);
    const int64_t width = loop_.width;
    T* grad_bias = grad_bias_.get() + (task / loop_.split.unit_blocks) * width;
    T* grad_rbias = grad_rbias_.get() + (task / loop_.split.unit_blocks) * width;
    for (int64_t b = rows.begin; b < rows.end; ++b) {
      if (!loop_.Active(t, b)) continue;
      const T* grad = loop_.GradRow(t, b);
      for (int64_t g = 0; g < G; ++g) {
        const int64_t first = g * hidden + units.begin;
        AddInto(grad + first, grad_bias + first, count);
      }
      if (!separate_rbias_) continue;
      const T* recurrent = cell_->RecurrentBiasRow(t, b);
      for (int64_t g = 0; g < G; ++g) {
        const int64_t first = g * hidden + units.begin;
        AddInto(recurrent + first, grad_rbias + first, count);
      }
    }
  }

  // The current window, times [lo, hi), adds its share of dW, dR and the cell's own weights (the
  // cell's AddWindowGradients) and (with `input_grad`) dX; `first` starts the sums. Row (t, b) of
  // the window is row t*N + b of X / dX past row lo*N.
  void AddWindowGradients(int64_t lo, int64_t hi, bool first, const T* x, T* input_grad, T input_beta,
                          const Executor& executor) {
    const LstmDims& dims = loop_.dims;
    const BackwardIo<T>& io = loop_.io;
    const int64_t width = loop_.width;
    const int64_t input_size = dims.input_size;
    const int64_t rows = (hi - lo) * dims.batch_size;  // with one window, all T*N rows in X's order
    const int64_t offset = dims.layout == 0 ? lo * dims.batch_size : 0;
    const T* grad = loop_.GradGates();
    // dW, the cell's dR and dX read the window's dpre unchanged: a bf16 GEMM rounds it once.
    const Bf16ReuseLeftOperand round_grad_once;
    // dW [G*H, I] += dpre^T [G*H, rows] * X [rows, I]: M = G*H, N = I, K = rows, A transposed.
    if (io.dW) {
      RecurrentParallelGemm(io.precision, executor, true, false, width, input_size, rows, grad, width,
                            x + offset * input_size, input_size, first ? T(0) : T(1),
                            io.dW + loop_.d * width * input_size, input_size);
    }
    cell_->AddWindowGradients(lo, hi, first, executor);
    // dX [rows, I] (+)= dpre [rows, G*H] * W [G*H, I]: M = rows, N = I, K = G*H.
    if (input_grad) {
      RecurrentParallelGemm(io.precision, executor, false, false, rows, input_size, width, grad, width,
                            io.W + loop_.d * width * input_size, input_size, input_beta,
                            input_grad + offset * input_size, input_size);
    }
  }

  BackwardLoop<T> loop_;
  std::unique_ptr<Cell> cell_;
  const bool separate_rbias_;  // the cell's SeparateRecurrentBias()
  Scratch<T> grad_bias_;   // [groups, G*H] column sums of the gate gradients, each group's over its rows
                           // (a block of units owns its columns, so blocks share one row)
  Scratch<T> grad_rbias_;  // [groups, G*H] likewise of the cell's RecurrentBiasRow, where it has one
  const bool copy_carry_blocks_;  // whether each block's R[:K, units] is copied for its carry GEMM
  Scratch<T> carry_copy_;         // [K, H]: block by block, each [K, units] (Recurrence)
};

// The two directions of a bidirectional cell run as two parallel tasks, each serial inside, only
// when one step is too small to split into blocks of hidden units of 2^17 multiply-adds (the Intel
// VM's MinBlockWork, lstm_math.h), or the cell takes no blocks, and there are too few batch
// entries for groups. Otherwise they run one after the other, each over the whole executor: about
// as fast (LSTM M-bidir: 34.3 vs 33.7 ms, 2 threads) and only one direction's gate gradients are
// alive at a time. (The forward keeps its directions in parallel: it gains more from it.)
// Not MinBlockWork itself: on AMD Zen 3 blocks of its 2^15 were slower than the directions in
// parallel (LSTM S-bidir (16, 8, 64, 64) bwd 0.367 vs 0.297 ms, B1-bidir 3.70 vs 2.97 ms).
// A cell that asks for it (BackwardTasks::directions_first) runs them as two tasks whenever the
// executor has the width, as the forward does.
template <typename T>
bool BackwardDirectionsInParallel(const LstmDims& dims, const Executor& executor, const BackwardTasks& tasks) {
  constexpr int64_t kMinBlockWorkBesideDirections = int64_t{1} << 17;
  if (dims.num_directions != 2 || executor.Width() < 2) return false;
  if (tasks.directions_first) return true;
  // Groups of 8 entries or more rule the directions out; those of 4 (small steps) do not, as before them.
  const StepSplit split = SplitTimeLoop<T>(dims, executor, kMaxBackwardGroupWeightBytes, false);
  return split.row_groups == 1 &&
         (!tasks.unit_blocks || StepBlocks(dims, executor, kMinBlockWorkBesideDirections) == 1);
}

// Runs one backward call: a driver per direction with the cell make_cell(loop) returns (a
// std::unique_ptr<Cell> built on the direction's BackwardLoop), its loop cut as `tasks` allows.
template <typename T, typename Cell, typename MakeCell>
void RunBackward(const LstmDims& dims, const BackwardIo<T>& io, const std::array<bool, 2>& reverse,
                 const BackwardTasks& tasks, const Executor& executor, const ScratchAllocator& allocator,
                 const MakeCell& make_cell) {
  // Padded steps have zero gate gradients, but 0 * NaN is NaN: whatever X holds there must not
  // reach dW, so those rows are zeroed in a copy when there are any.
  const T* x_for_weights = io.X;
  Scratch<T> masked_x;
  if (io.dW && io.sequence_lens &&
      std::any_of(io.sequence_lens, io.sequence_lens + dims.batch_size,
                  [&](int32_t length) { return length < dims.seq_length; })) {
    const int64_t input_size = dims.input_size;
    masked_x = Scratch<T>(allocator, dims.Rows() * input_size);
    for (int64_t t = 0; t < dims.seq_length; ++t) {
      for (int64_t b = 0; b < dims.batch_size; ++b) {
        const int64_t row = dims.XRow(t, b) * input_size;
        if (t < io.sequence_lens[b]) {
          std::copy_n(io.X + row, input_size, masked_x.get() + row);
        } else {
          std::fill_n(masked_x.get() + row, input_size, T(0));
        }
      }
    }
    x_for_weights = masked_x.get();
  }
  using Driver = BackwardDriver<T, Cell>;
  if (BackwardDirectionsInParallel<T>(dims, executor, tasks)) {
    // One window each; dX = sum over directions of dpre [T*N, G*H] * W [G*H, I] once both are done.
    const SerialExecutor serial;
    const int64_t steps = Driver::ChunkSteps(dims, true, tasks.windows);
    Driver forward(dims, io, 0, reverse[0], StepSplit{}, steps, allocator, make_cell);
    Driver backward(dims, io, 1, reverse[1], StepSplit{}, steps, allocator, make_cell);
    executor.For(2, [&](size_t d) { (d == 0 ? forward : backward).Recurrence(serial, x_for_weights, nullptr, T(0)); });
    forward.WriteBiasGradient();
    backward.WriteBiasGradient();
    if (io.dX) {
      const int64_t width = dims.GateWidth();
      for (int64_t d = 0; d < 2; ++d) {
        RecurrentParallelGemm(io.precision, executor, false, false, dims.Rows(), dims.input_size, width,
                              (d == 0 ? forward : backward).GradGates(), width, io.W + d * width * dims.input_size,
                              dims.input_size, d == 0 ? T(0) : T(1), io.dX, dims.input_size);
      }
    }
    return;
  }
  StepSplit split = SplitTimeLoop<T>(dims, executor, kMaxBackwardGroupWeightBytes);
  if (!tasks.unit_blocks) split.unit_blocks = 1;
  const int64_t chunk = Driver::ChunkSteps(dims, false, tasks.windows);
  for (int64_t d = 0; d < dims.num_directions; ++d) {
    Driver direction(dims, io, d, reverse[d], split, chunk, allocator, make_cell);
    direction.Recurrence(executor, x_for_weights, io.dX, d == 0 ? T(0) : T(1));
    direction.WriteBiasGradient();
  }
}

}  // namespace ortlstm
