// The recurrent family's forward time loop, shared by every cell (LSTM: lstm/lstm_forward.cc, GRU:
// gru/gru_forward.cc) and templated on a cell policy, in the way oneDNN runs all its RNN cells on
// one driver with a per-cell post-GEMM. The driver owns what does not depend on the cell: the
// input projection X W^T for all steps (one GEMM), the per-step recurrent GEMMs H R^T, cutting the
// time loop into executor tasks (SplitTimeLoop, lstm/lstm_math.h: groups of batch entries through
// every step, or blocks of hidden units with block-major gate columns, one phase of tasks per
// step, every phase inside one round of the executor: ForPhases, common/parallel.h), the
// two directions as two tasks, sequence_lens (an entry past its length passes its state through
// and its step outputs are zero), reverse, layout 1 and the final state. The cell owns its gates'
// pointwise math, its extra state (the LSTM's C) and its stash (IOFC, ZRH). Layouts:
// lstm/lstm_dims.h, with `gates` = the cell's kGates.
//
// The GEMM call sites, named for issue 33 (matmul_precision): ForwardDriver::ProjectInputs (input
// projection) and the StepOperand of each stage in ForwardDriver::Run (per-step recurrent GEMM),
// both under ForwardIo::precision (recurrent/recurrent_gemm.h).
//
// A cell policy (one object per direction) provides:
//   static constexpr int64_t kGates;   gate columns per hidden unit (LSTM 4, GRU 3, RNN 1)
//   static constexpr bool kAccumulate; stage GEMMs add into the projected gates (beta 1) rather
//                                      than write the cell's own recurrent rows (beta 0)
//   int64_t Stages() const;            recurrent GEMMs per step, each followed by a pointwise pass;
//                                      a stage past the first multiplies a row the cell built in
//                                      the previous stage's pass (GRU, linear_before_reset = 0:
//                                      (r . H_{t-1}) Rh^T), so with blocks of units every stage
//                                      is a round of tasks of its own
//   Range StageGates(int64_t s) const; the gates [first, end) whose columns stage s's GEMM fills
//   const T* StageInput(int64_t s) const;          [N, H] left operand of stage s > 0
//   T* StageOutput(int64_t b) const;               row b [G*H] of its recurrent products when !kAccumulate
//   void InitialState(int64_t b);                  the cell's own state of entry b (C), if any
//   void Inactive(int64_t t, int64_t b, int64_t seq_row, Range units);  zero its stash at a pad
//   void Pointwise(int64_t s, int64_t t, int64_t b, Range units, const ForwardRow<T>& row);
//   void FinalState(int64_t b, bool ran);          its own final state (Ct), zero unless `ran`
// The ONNX RNN, Ht = f(Xt W^T + Ht-1 R^T + Wb + Rb), is the simplest such policy: kGates 1, one
// stage accumulated into the gates, a pointwise pass of bias and f, no state or stash of its own.
#pragma once

#include <algorithm>
#include <array>
#include <memory>
#include <vector>

#include "common/blas.h"
#include "common/scratch.h"
#include "lstm/lstm_math.h"
#include "recurrent/recurrent_gemm.h"
#include "recurrent/recurrent_io.h"

namespace ortlstm {

// The driver's tensors of one call (all directions); optional ones are nullptr.
template <typename T>
struct ForwardIo : RecurrentInputs<T> {
  T* HAll = nullptr;
  T* Ht = nullptr;
  T* stash = nullptr;  // [.., G*H] the activated gates (IOFC, ZRH), in the cell's gate order
};

// The driver's tensors from a cell's forward tensors (LstmForwardTensors, GruForwardTensors, ...);
// `stash` is the cell's own stash output (IOFC, ZRH).
template <typename T, typename Tensors>
ForwardIo<T> ForwardIoOf(const Tensors& tensors, T* stash, MatmulPrecision precision) {
  ForwardIo<T> io;
  io.TakeInputs(tensors, precision);
  io.HAll = tensors.HAll;
  io.Ht = tensors.Ht;
  io.stash = stash;
  return io;
}

// What the driver hands a cell's pointwise pass for one batch entry and one block of units.
template <typename T>
struct ForwardRow {
  T* gates;          // G*count pre-activations of the block (block-major), X W^T (+ H R^T when kAccumulate)
  const T* h_prev;   // H_{t-1}[units]
  T* h_out;          // H_t[units]
  int64_t seq_row;   // row of HAll and the stash
  bool gates_in_stash;  // `gates` is the stash itself (one direction, one block)
};

// Row `row` of W or R (gate-major: gate * H + unit) -> its row in the block-major order, where
// block k of units [u0, u1) has columns [G*u0, G*u1), each gate's units of the block in turn.
inline int64_t BlockMajorRow(int64_t row, int64_t gates, int64_t hidden, int64_t blocks) {
  const int64_t gate = row / hidden;
  const int64_t unit = row % hidden;
  // The block holding `unit`: SplitRange gives the first `extra` blocks one more unit.
  const int64_t base = hidden / blocks;
  const int64_t extra = hidden % blocks;
  const int64_t k = unit < extra * (base + 1) ? unit / (base + 1) : extra + (unit - extra * (base + 1)) / base;
  const Range units = SplitRange(hidden, blocks, k);
  return gates * units.begin + gate * (units.end - units.begin) + (unit - units.begin);
}

// Copies the rows of the units `units` of a gate-major [G*H, cols] matrix to their block-major
// place (BlockMajorRow): each gate's rows of the block are contiguous in both, so one copy a gate.
template <typename T>
void CopyBlockRows(const T* from, int64_t gates, int64_t hidden, int64_t cols, Range units, T* to) {
  const int64_t count = units.end - units.begin;
  for (int64_t g = 0; g < gates; ++g) {
    std::copy_n(from + (g * hidden + units.begin) * cols, count * cols, to + (gates * units.begin + g * count) * cols);
  }
}

template <typename T, typename Cell>
class ForwardDriver {
 public:
  static constexpr int64_t G = Cell::kGates;

  ForwardDriver(const LstmDims& dims, bool reverse, const ForwardIo<T>& io, int64_t d, StepSplit split,
                const ScratchAllocator& allocator, Cell& cell)
      : dims_(dims),
        io_(io),
        d_(d),
        hidden_(dims.hidden_size),
        width_(dims.GateWidth()),
        split_(split),
        reverse_(reverse),
        gates_in_stash_(io.stash != nullptr && dims.num_directions == 1 && split.unit_blocks == 1),
        cell_(cell),
        gates_scratch_(allocator, gates_in_stash_ ? 0 : dims.Rows() * width_),
        hidden_scratch_(allocator, 2 * dims.batch_size * dims.hidden_size),
        W_copy_(allocator, split.unit_blocks > 1 ? width_ * dims.input_size : 0),
        R_copy_(allocator, split.unit_blocks > 1 ? width_ * hidden_ : 0),
        gates_(gates_in_stash_ ? io.stash : gates_scratch_.get()),
        W_(io.W + d * width_ * dims.input_size),
        R_(io.R + d * width_ * hidden_) {
    if (split_.unit_blocks > 1) {
      // W here, for the input projection. R by each block's task in Run, so the copy is split
      // between the workers and a block's rows start in the cache of the core that reads them
      // every step (GRU S forward, 2 threads: 84-85 -> 80-81 us); here too if groups of entries
      // also cut the step (several tasks per block; SplitTimeLoop never does both).
      for (int64_t k = 0; k < split_.unit_blocks; ++k) {
        const Range units = SplitRange(hidden_, split_.unit_blocks, k);
        CopyBlockRows(W_, G, hidden_, dims.input_size, units, W_copy_.get());
        if (split_.row_groups > 1) CopyBlockRows(R_, G, hidden_, hidden_, units, R_copy_.get());
      }
      W_ = W_copy_.get();
      R_ = R_copy_.get();
    }
  }

  // The input projection, a GEMM call site: gates [T*N, G*H] = X [T*N, I] * W^T (block-major rows).
  void ProjectInputs(const Executor& executor) {
    RecurrentParallelGemm(io_.precision, executor, false, true, dims_.Rows(), width_, dims_.input_size, io_.X,
                          dims_.input_size, W_, dims_.input_size, T(0), gates_, width_);
  }

  void Run(const Executor& executor) {
    const int64_t batch = dims_.batch_size;
    T* h = hidden_scratch_.get();
    for (int64_t b = 0; b < batch; ++b) {
      if (io_.initial_h) {
        std::copy_n(io_.initial_h + dims_.StateRow(d_, b) * hidden_, hidden_, h + b * hidden_);
      } else {
        std::fill_n(h + b * hidden_, hidden_, T(0));
      }
      cell_.InitialState(b);
    }
    // The per-step recurrent GEMM call site: each task's rows of R for each stage (its block's
    // columns of the stage's gates, or all of them for its group of entries), packed once.
    const int64_t stages = cell_.Stages();
    std::vector<StepOperand<T>> recurrent(static_cast<size_t>(split_.Tasks() * stages));
    executor.For(static_cast<size_t>(split_.Tasks()), [&](size_t k) {
      const Range units = split_.Units(hidden_, static_cast<int64_t>(k));
      const Range rows = split_.Rows(batch, static_cast<int64_t>(k));
      if (units.end <= units.begin || rows.end <= rows.begin) return;
      const int64_t count = units.end - units.begin;
      if (split_.unit_blocks > 1 && split_.row_groups == 1) {
        CopyBlockRows(io_.R + d_ * width_ * hidden_, G, hidden_, hidden_, units, R_copy_.get());
      }
      for (int64_t s = 0; s < stages; ++s) {
        const Range g = cell_.StageGates(s);
        recurrent[k * stages + s] =
            StepOperand<T>(io_.precision, true, true, rows.end - rows.begin, (g.end - g.begin) * count, hidden_,
                           R_ + (G * units.begin + g.begin * count) * hidden_, hidden_);
      }
    });
    const int64_t steps = dims_.seq_length;
    // Stages after the first need every block's previous stage: then a stage is a round of its own.
    const bool stage_rounds = split_.unit_blocks > 1 && stages > 1;
    const int64_t per_round = split_.StepsPerRound(steps);
    const int64_t rounds_per_chunk = stage_rounds ? stages : 1;
    const int64_t chunks = steps > 0 ? (steps + per_round - 1) / per_round : 0;
    // Each round of tasks is a phase of ForPhases: one executor round for the whole time loop.
    ForPhases(executor, chunks * rounds_per_chunk, static_cast<int64_t>(recurrent.size()) / stages,
              [&](int64_t phase, int64_t task) {
                const int64_t first = phase / rounds_per_chunk * per_round;
                const int64_t last = std::min(first + per_round, steps);
                const int64_t round = phase % rounds_per_chunk;
                const Range units = split_.Units(hidden_, task);
                const Range rows = split_.Rows(batch, task);
                for (int64_t p = first; p < last; ++p) {
                  const T* h_prev = h + (p % 2) * batch * hidden_;
                  T* h_next = h + ((p + 1) % 2) * batch * hidden_;
                  const int64_t t = reverse_ ? steps - 1 - p : p;
                  for (int64_t s = stage_rounds ? round : 0; s < (stage_rounds ? round + 1 : stages); ++s) {
                    Stage(s, t, units, rows, recurrent[task * stages + s], h_prev, h_next);
                  }
                }
              });
    WriteFinalState(h + (steps % 2) * batch * hidden_);
  }

 private:
  // Stage s of step t for one task: the stage's recurrent GEMM for the task's rows and block,
  // then the cell's pointwise pass over them (stage 0 also handles entries past their length).
  void Stage(int64_t s, int64_t t, Range units, Range rows, const StepOperand<T>& recurrent, const T* h_prev,
             T* h_next) {
    const int64_t count = units.end - units.begin;
    if (count <= 0 || rows.end <= rows.begin) return;
    const Range g = cell_.StageGates(s);
    const int64_t column = G * units.begin + g.begin * count;
    const T* input = s == 0 ? h_prev : cell_.StageInput(s);
    const int64_t m = rows.end - rows.begin;
    if constexpr (Cell::kAccumulate) {
      // gates[rows, block] += H_{t-1}[rows] * R[block rows, :]^T: M = rows, N = gates*count, K = H.
      recurrent.Multiply(input + rows.begin * hidden_, hidden_, T(1),
                         gates_ + dims_.XRow(t, rows.begin) * width_ + column, dims_.BatchStride() * width_, m);
    } else {
      recurrent.Multiply(input + rows.begin * hidden_, hidden_, T(0), cell_.StageOutput(rows.begin) + column, width_,
                         m);
    }
    for (int64_t b = rows.begin; b < rows.end; ++b) {
      const int64_t seq_row = dims_.SeqRow(t, d_, b);
      const bool active = io_.sequence_lens == nullptr || t < io_.sequence_lens[b];
      T* h_out = h_next + b * hidden_ + units.begin;
      if (!active) {
        if (s != 0) continue;
        // The state passes through unchanged; the step's outputs are zero.
        std::copy_n(h_prev + b * hidden_ + units.begin, count, h_out);
        if (io_.HAll) std::fill_n(io_.HAll + seq_row * hidden_ + units.begin, count, T(0));
        cell_.Inactive(t, b, seq_row, units);
        continue;
      }
      const ForwardRow<T> row{gates_ + dims_.XRow(t, b) * width_ + G * units.begin, h_prev + b * hidden_ + units.begin,
                              h_out, seq_row, gates_in_stash_};
      cell_.Pointwise(s, t, b, units, row);
      if (io_.HAll && s + 1 == cell_.Stages()) std::copy_n(h_out, count, io_.HAll + seq_row * hidden_ + units.begin);
    }
  }

  // An entry that ran no step reports a zero final state, not its initial state (as onnxruntime's
  // LSTM does), so nothing flows back from Ht into initial_h for it.
  void WriteFinalState(const T* h) {
    for (int64_t b = 0; b < dims_.batch_size; ++b) {
      const bool ran = dims_.seq_length > 0 && (io_.sequence_lens == nullptr || io_.sequence_lens[b] > 0);
      if (io_.Ht) {
        T* out = io_.Ht + dims_.StateRow(d_, b) * hidden_;
        if (ran) {
          std::copy_n(h + b * hidden_, hidden_, out);
        } else {
          std::fill_n(out, hidden_, T(0));
        }
      }
      cell_.FinalState(b, ran);
    }
  }

  const LstmDims& dims_;
  const ForwardIo<T>& io_;
  const int64_t d_;
  const int64_t hidden_;
  const int64_t width_;
  const StepSplit split_;  // how the time loop is cut into tasks
  const bool reverse_;
  // One direction and one block: X's row order is the stash's and the block-major columns are its
  // gate order, so the stash itself holds the pre-activations and the cell activates them in
  // place (no [T*N, G*H] scratch, and the stash is written while it is in cache).
  const bool gates_in_stash_;
  Cell& cell_;
  Scratch<T> gates_scratch_;   // [T*N, G*H] pre-activations, X row order, unless the stash holds them
  Scratch<T> hidden_scratch_;  // [2, N, H] H_{t-1} and H_t, swapped every step
  Scratch<T> W_copy_;          // [G*H, I] block-major rows, when a step is cut into several blocks
  Scratch<T> R_copy_;          // [G*H, H] likewise, each block's rows copied by its task in Run
  T* const gates_;
  const T* W_;  // [G*H, I] of this direction, block-major rows
  const T* R_;  // [G*H, H] likewise
};

// Runs one forward call: builds each direction's cell with make_cell(d, split) and a driver for
// it, projects the inputs, then runs the directions' recurrences, as two parallel tasks (each
// serial inside) when the executor has the width.
template <typename T, typename Cell, typename MakeCell>
void RunForward(const LstmDims& dims, const ForwardIo<T>& io, const std::array<bool, 2>& reverse,
                const Executor& executor, const ScratchAllocator& allocator, const MakeCell& make_cell) {
  const bool directions_in_parallel = dims.num_directions == 2 && executor.Width() >= 2;
  const SerialExecutor serial;
  const Executor& step_executor = directions_in_parallel ? static_cast<const Executor&>(serial) : executor;
  const StepSplit split = SplitTimeLoop<T>(dims, step_executor, L2CacheBytes());
  std::vector<std::unique_ptr<Cell>> cells;
  std::vector<std::unique_ptr<ForwardDriver<T, Cell>>> drivers;
  for (int64_t d = 0; d < dims.num_directions; ++d) {
    cells.push_back(make_cell(d, split));
    drivers.push_back(std::make_unique<ForwardDriver<T, Cell>>(dims, reverse[d], io, d, split, allocator, *cells[d]));
  }
  for (auto& driver : drivers) driver->ProjectInputs(executor);
  if (directions_in_parallel) {
    executor.For(2, [&](size_t d) { drivers[d]->Run(serial); });
  } else {
    for (auto& driver : drivers) driver->Run(executor);
  }
}

}  // namespace ortlstm
