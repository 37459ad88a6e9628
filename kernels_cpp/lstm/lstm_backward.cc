// LSTM backward for LSTMGrad, from the stashed HAll, CAll and activated gates (no forward re-run).
// The reverse time loop holds only the recurrence, cut into executor tasks as in the forward
// (SplitTimeLoop, lstm_math.h): groups of batch entries, each through all of a window's steps, or
// blocks of hidden units, one round of tasks per step. Per step, a GEMM carries the later step's
// dpre back through R to the task's part of dH, then a pointwise pass turns dH_t, dC_t into the
// task's pre-activation gradients of step t and adds them to its dB sums. The gate gradients are
// kept for a window of steps at a time; each finished window adds its share of dX, dW and dR
// (GEMMs with K = the window's rows) and of dP (a reduction). Every split is fixed by the shapes
// and the executor's width, so the result does not depend on scheduling. Layouts:
// lstm/lstm_dims.h.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "common/blas.h"
#include "lstm/gate_math.h"
#include "lstm/lstm_math.h"
#include "recurrent/recurrent_gemm.h"

namespace ortlstm {
namespace {

// Groups of batch entries are taken while R is at most this size (SplitTimeLoop), whatever the
// L2 cache: each step multiplies by R untransposed (K = 4H), and on AMD Zen 3 (512 KB of L2,
// R of 1 MiB at M) blocks of units were no faster than groups there (M bwd 28.1 vs 28.2 ms, M-bidir
// 56.2 vs 55.0 ms), unlike the forward's. 2 MiB is the L2 of the Intel VM it was tuned on.
constexpr int64_t kMaxGroupWeightBytes = int64_t{2} << 20;

// Per-block temporaries of the pointwise pass, one row of hidden units each.
constexpr int kTemporaries = 5;

// Gate gradients are kept for a window of `chunk` steps at a time (BackwardDirection), one window
// reused: a window's last step is carried into dH before its weight-gradient GEMMs, so the next
// window needs nothing of it. With a single window (chunk = seq_length) the rows are in X's row
// order.
template <typename T>
struct BackwardScratch {
  Scratch<T> grad_gates;   // [chunk*N, 4H]: dL/d(pre-activation) of i, o, f, c
  Scratch<T> hidden_prev;  // [chunk*N, H]: H_{t-1} as step t saw it, 0 if inactive;
                           // not needed when HAll can stand in for it (BackwardDirection)
  Scratch<T> grad_h;       // [N, H] dL/dH flowing into the step being processed
  Scratch<T> grad_c;       // [N, H] dL/dC flowing into the step being processed
  Scratch<T> temporaries;  // [tasks, kTemporaries, H]
  Scratch<T> zeros;        // [H] C_{t-1} of a first step without initial_c
  Scratch<T> grad_bias;    // [groups, 4H] column sums of dpre, each group's over its rows (a block of
                           // units owns its columns, so blocks share one row)
  BackwardScratch(const LstmDims& dims, StepSplit split, int64_t window_rows, bool with_hidden_prev,
                  const ScratchAllocator& allocator)
      : grad_gates(allocator, window_rows * dims.GateWidth()),
        hidden_prev(allocator, with_hidden_prev ? window_rows * dims.hidden_size : 0),
        grad_h(allocator, dims.batch_size * dims.hidden_size),
        grad_c(allocator, dims.batch_size * dims.hidden_size),
        temporaries(allocator, split.Tasks() * kTemporaries * dims.hidden_size),
        zeros(allocator, dims.hidden_size),
        grad_bias(allocator, split.row_groups * dims.GateWidth()) {
    std::fill_n(zeros.get(), dims.hidden_size, T(0));
    std::fill_n(grad_bias.get(), split.row_groups * dims.GateWidth(), T(0));
  }
};

template <typename T>
class BackwardDirection {
 public:
  // `chunk`: steps per window of gate gradients (ChunkSteps), seq_length for one window.
  BackwardDirection(const LstmDims& dims, const LstmConfig& config, const LstmBackwardTensors<T>& io, int64_t d,
                    StepSplit split, int64_t chunk, const ScratchAllocator& allocator)
      : dims_(dims),
        config_(config),
        io_(io),
        d_(d),
        hidden_size_(dims.hidden_size),
        width_(dims.GateWidth()),
        split_(split),
        reverse_(config.IsReverse(d)),
        P_(io.P ? io.P + d * 3 * hidden_size_ : nullptr),
        f_act_(config.activations[d].f, config.clip),
        g_act_(config.activations[d].g, config.clip),
        h_act_(config.activations[d].h),
        standard_cell_(UsesStandardCell(config, d, P_ != nullptr)),
        hidden_from_hall_(dims.num_directions == 1 && dims.layout == 0 && io.sequence_lens == nullptr),
        chunk_(std::max<int64_t>(chunk, 1)),
        scratch_(dims, split, chunk_ * dims.batch_size, !hidden_from_hall_, allocator) {}

  // Steps per window: enough rows (N per step) for the weight-gradient GEMMs of a window to run at
  // full speed, 512, and a single window when the steps cannot be windowed: layout 1 interleaves
  // the steps of all entries in X, and directions in parallel share dX, computed after both.
  static int64_t ChunkSteps(const LstmDims& dims, bool directions_in_parallel) {
    constexpr int64_t kWindowRows = 512;
    if (dims.layout != 0 || directions_in_parallel || dims.batch_size == 0) return dims.seq_length;
    const int64_t steps = (kWindowRows + dims.batch_size - 1) / dims.batch_size;
    return steps < dims.seq_length ? steps : dims.seq_length;
  }

  // The gate gradients of the whole sequence, when they were kept in one window.
  const T* GradGates() const { return scratch_.grad_gates.get(); }

  // The reverse time loop, window by window: dL/d(pre-activations) of each window's steps go into
  // the window's scratch, their column sums into grad_bias, and when the window is complete its
  // share of dW, dR, dP and (with `input_grad`) dX is added (AddWindowGradients). `x` is X with the
  // steps past each sequence's length zeroed (or X itself when every sequence is full).
  // `input_grad` is dX, accumulated into when `input_beta` is 1.
  void Recurrence(const Executor& executor, const T* x, T* input_grad, T input_beta) {
    const int64_t hidden = hidden_size_;
    T* gh = scratch_.grad_h.get();
    T* gc = scratch_.grad_c.get();
    // Ht/Ct of an entry that ran no step are constant zeros (lstm_forward.cc): their gradients stop.
    for (int64_t b = 0; b < dims_.batch_size; ++b) {
      const int64_t state = dims_.StateRow(d_, b) * hidden;
      const bool ran = Length(b) > 0;
      if (ran && io_.grad_Ht) {
        std::copy_n(io_.grad_Ht + state, hidden, gh + b * hidden);
      } else {
        std::fill_n(gh + b * hidden, hidden, T(0));
      }
      if (ran && io_.grad_Ct) {
        std::copy_n(io_.grad_Ct + state, hidden, gc + b * hidden);
      } else {
        std::fill_n(gc + b * hidden, hidden, T(0));
      }
    }
    // Task k owns hidden units `units` of entries `rows` (StepSplit). For each step, first
    //   dH_t[rows, units] += dpre_{t+1}[rows] [., 4H] * R[:, units]  (M = rows, N = units, K = 4H),
    // which needs the task's rows of dpre_{t+1} at every unit (with blocks of units, the previous
    // round), then the pointwise pass of step t, which needs only these entries of dH_t. R is not
    // packed here (unlike the forward's R^T): oneMKL runs this untransposed product as fast from R
    // itself (32 x 128 x 1024: 54 us plain, 59 us packed; 16 x 256 x 1024: no faster packed in
    // the kernel). `count` steps from processing step `first` run in one round; with `carry` the
    // round ends by carrying its last step's dpre into dH (for the next window's first step, or
    // dH0), which a task can do for its own rows only when it owns every unit of them.
    // Each task's R[:, units] for the carry, once per op call (a bf16 operand rounds it here).
    std::vector<StepOperand<T>> carry_weights(static_cast<size_t>(split_.Tasks()));
    executor.For(carry_weights.size(), [&](size_t k) {
      const Range units = split_.Units(hidden, static_cast<int64_t>(k));
      const Range rows = split_.Rows(dims_.batch_size, static_cast<int64_t>(k));
      if (units.end <= units.begin || rows.end <= rows.begin) return;
      carry_weights[k] = StepOperand<T>(config_.matmul_precision, false, false, rows.end - rows.begin,
                                        units.end - units.begin, width_, io_.R + d_ * width_ * hidden + units.begin,
                                        hidden);
    });
    const T* later_grad = nullptr;  // dpre of the step processed last (its row 0), until carried
    const int64_t steps = dims_.seq_length;
    auto time_of = [&](int64_t p) { return reverse_ ? p : steps - 1 - p; };
    auto round = [&](int64_t first, int64_t count, bool carry) {
      executor.For(static_cast<size_t>(split_.Tasks()), [&](size_t k) {
        const auto task = static_cast<int64_t>(k);
        const Range units = split_.Units(hidden, task);
        const Range rows = split_.Rows(dims_.batch_size, task);
        const T* later = later_grad;
        for (int64_t p = first; p < first + count; ++p) {
          CarryBack(later, units, rows, carry_weights[k]);
          Pointwise(time_of(p), units, rows, task);
          later = GradRow(time_of(p), 0);
        }
        if (carry) CarryBack(later, units, rows, carry_weights[k]);
      });
      if (count > 0) later_grad = GradRow(time_of(first + count - 1), 0);
      if (carry) later_grad = nullptr;
    };
    for (int64_t first = 0; first < steps; first += chunk_) {
      // Processing steps [first, last) are times [lo, hi) (the loop runs backwards in time unless
      // the direction is reversed).
      const int64_t last = std::min(first + chunk_, steps);
      const int64_t lo = reverse_ ? first : steps - last;
      const int64_t hi = reverse_ ? last : steps - first;
      window_lo_ = lo;
      // The window's last step goes into dH before its GEMMs, so that the window can be reused:
      // inside the last round when each task owns whole rows, else in a round of its own.
      const bool carry = last < steps || io_.dH0 != nullptr;
      const bool carry_in_round = split_.unit_blocks == 1;
      const int64_t per_round = std::min(split_.StepsPerRound(steps), last - first);
      for (int64_t p = first; p < last; p += per_round) {
        const int64_t count = std::min(per_round, last - p);
        round(p, count, carry && carry_in_round && p + count == last);
      }
      if (carry && !carry_in_round) round(last, 0, true);
      AddWindowGradients(lo, hi, first == 0, x, input_grad, input_beta, executor);
    }
    if (steps == 0) AddWindowGradients(0, 0, true, x, input_grad, input_beta, executor);  // zero sums
    for (int64_t b = 0; b < dims_.batch_size; ++b) {
      const int64_t state = dims_.StateRow(d_, b) * hidden;
      if (io_.dH0) std::copy_n(gh + b * hidden, hidden, io_.dH0 + state);
      if (io_.dC0) std::copy_n(gc + b * hidden, hidden, io_.dC0 + state);
    }
  }

  // dB of this direction, from the finished recurrence: the column sums of dpre, to both the Wb
  // and the Rb half.
  void WriteBiasGradient() const {
    if (!io_.dB) return;
    T* dB = io_.dB + d_ * 2 * width_;
    const T* sums = scratch_.grad_bias.get();
    std::copy_n(sums, width_, dB);
    for (int64_t g = 1; g < split_.row_groups; ++g) {  // in group order, fixed by the shapes
      for (int64_t j = 0; j < width_; ++j) dB[j] += sums[g * width_ + j];
    }
    std::copy_n(dB, width_, dB + width_);
  }

 private:
  // Row (t, b) of the current window of gate gradients / previous hidden states.
  int64_t WindowRow(int64_t t, int64_t b) const {
    return dims_.layout == 0 ? (t - window_lo_) * dims_.batch_size + b : dims_.XRow(t, b);
  }
  T* GradRow(int64_t t, int64_t b) const {
    return scratch_.grad_gates.get() + WindowRow(t, b) * width_;
  }
  T* HiddenPrevRow(int64_t t, int64_t b) const {
    return scratch_.hidden_prev.get() + WindowRow(t, b) * hidden_size_;
  }

  // The current window, times [lo, hi), adds its share of dW, dR, dP and (with `input_grad`) dX;
  // `first` starts the sums. Row (t, b) of the window is row t*N + b of X / dX past row lo*N.
  void AddWindowGradients(int64_t lo, int64_t hi, bool first, const T* x, T* input_grad, T input_beta,
                          const Executor& executor) const {
    const int64_t batch = dims_.batch_size;
    const int64_t hidden = hidden_size_;
    const int64_t input_size = dims_.input_size;
    const int64_t rows = (hi - lo) * batch;  // with one window, all T*N rows in X's order
    const int64_t offset = dims_.layout == 0 ? lo * batch : 0;
    const T* grad = scratch_.grad_gates.get();
    const T beta = first ? T(0) : T(1);
    const Bf16ReuseLeftOperand round_grad_once;  // dW, dR and dX read dpre (grad) unchanged: bf16 rounds it once
    // dW [4H, I] += dpre^T [4H, rows] * X [rows, I]: M = 4H, N = I, K = rows, A transposed.
    if (io_.dW) {
      RecurrentParallelGemm(config_.matmul_precision, executor, true, false, width_, input_size, rows, grad, width_,
                            x + offset * input_size, input_size, beta, io_.dW + d_ * width_ * input_size, input_size);
    }
    // dR [4H, H] += dpre^T [4H, rows] * H_prev [rows, H]: M = 4H, N = H, K = rows, A transposed.
    T* dR = io_.dR ? io_.dR + d_ * width_ * hidden : nullptr;
    if (dR && !hidden_from_hall_) {
      const T* hidden_prev = scratch_.hidden_prev.get();
      RecurrentParallelGemm(config_.matmul_precision, executor, true, false, width_, hidden, rows, grad, width_,
                            hidden_prev, hidden, beta, dR, hidden);
    } else if (dR) {
      // H_prev of a step is HAll of the step processed before it, one step of rows away (HAll
      // [T, 1, N, H] has X's row order here), except for the first step processed: initial_h.
      const int64_t steps = dims_.seq_length;
      const int64_t from = reverse_ ? lo : std::max<int64_t>(lo, 1);           // times with a
      const int64_t to = reverse_ ? std::min<int64_t>(hi, steps - 1) : hi;     // previous step
      const int64_t count = std::max<int64_t>(to - from, 0) * batch;
      const T* hidden_before = io_.HAll + (reverse_ ? from + 1 : from - 1) * batch * hidden;
      RecurrentParallelGemm(config_.matmul_precision, executor, true, false, width_, hidden, count,
                            grad + (from - lo) * batch * width_, width_, count > 0 ? hidden_before : io_.HAll, hidden,
                            beta, dR, hidden);
      const int64_t start = reverse_ ? steps - 1 : 0;  // the first step processed
      if (io_.initial_h && start >= lo && start < hi) {
        RecurrentParallelGemm(config_.matmul_precision, executor, true, false, width_, hidden, batch,
                              grad + (start - lo) * batch * width_, width_, io_.initial_h, hidden, T(1), dR, hidden);
      }
    }
    // dX [rows, I] (+)= dpre [rows, 4H] * W [4H, I]: M = rows, N = I, K = 4H.
    if (input_grad) {
      RecurrentParallelGemm(config_.matmul_precision, executor, false, false, rows, input_size, width_, grad, width_,
                            io_.W + d_ * width_ * input_size, input_size, input_beta, input_grad + offset * input_size,
                            input_size);
    }
    // dPi += sum dpre_i . Ct-1,  dPo += sum dpre_o . Ct,  dPf += sum dpre_f . Ct-1  (over t, b).
    if (io_.dP) {
      T* dPi = io_.dP + d_ * 3 * hidden;
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
            if (t >= Length(b)) continue;
            const T* cp = PreviousCell(t, b);
            const T* cell = io_.CAll + dims_.SeqRow(t, d_, b) * hidden;
            const T* dpre = GradRow(t, b);
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

  int64_t Length(int64_t b) const { return io_.sequence_lens ? io_.sequence_lens[b] : dims_.seq_length; }

  // The step before t in processing order, or -1 when t is the first step of entry b.
  int64_t PreviousStep(int64_t t, int64_t b) const {
    if (reverse_) return t + 1 < Length(b) ? t + 1 : -1;
    return t - 1;
  }

  // C_{t-1} [H] as step t of entry b saw it.
  const T* PreviousCell(int64_t t, int64_t b) const {
    const int64_t prev = PreviousStep(t, b);
    if (prev >= 0) return io_.CAll + dims_.SeqRow(prev, d_, b) * hidden_size_;
    if (io_.initial_c) return io_.initial_c + dims_.StateRow(d_, b) * hidden_size_;
    return scratch_.zeros.get();
  }

  // dH_t[rows, units] += dpre_{t+1}[rows] [., 4H] * R[:, units] [4H, .] (M = rows, N = units,
  // K = 4H), `later` being dpre_{t+1}'s row 0; nothing before the first step processed (null).
  // `weight` is the task's R[:, units] (Recurrence).
  void CarryBack(const T* later, Range units, Range rows, const StepOperand<T>& weight) {
    if (later == nullptr || units.end <= units.begin || rows.end <= rows.begin) return;
    const int64_t step_ld = dims_.BatchStride() * width_;
    weight.Multiply(later + rows.begin * step_ld, step_ld, T(1),
                    scratch_.grad_h.get() + rows.begin * hidden_size_ + units.begin, hidden_size_,
                    rows.end - rows.begin);
  }

  // Step t, hidden units [units.begin, units.end) of entries [rows.begin, rows.end): dpre_t,
  // dC_{t-1}, H_{t-1}. `task` indexes the task's scratch.
  void Pointwise(int64_t t, Range units, Range rows, int64_t task) {
    const int64_t hidden = hidden_size_;
    const int64_t count = units.end - units.begin;
    if (count <= 0) return;
    T* temporaries = scratch_.temporaries.get() + task * kTemporaries * hidden;
    T* dh = temporaries;                   // dL/dH_t
    T* h_of_c = temporaries + hidden;      // h(C_t), then scratch
    T* dh_of_c = temporaries + 2 * hidden;  // h'(C_t)
    T* dact = temporaries + 3 * hidden;    // a gate activation's derivative
    T* dc = temporaries + 4 * hidden;      // dL/dC_t
    for (int64_t b = rows.begin; b < rows.end; ++b) {
      T* dpre = GradRow(t, b);
      T* h_prev = hidden_from_hall_ ? nullptr : HiddenPrevRow(t, b) + units.begin;
      if (t >= Length(b)) {
        for (int64_t g = 0; g < 4; ++g) std::fill_n(dpre + g * hidden + units.begin, count, T(0));
        if (h_prev) std::fill_n(h_prev, count, T(0));
        continue;
      }
      const int64_t seq_row = dims_.SeqRow(t, d_, b);
      const int64_t prev = PreviousStep(t, b);
      const int64_t state = dims_.StateRow(d_, b) * hidden;
      if (h_prev) {  // else dR reads HAll directly (AddWindowGradients)
        if (prev >= 0) {
          std::copy_n(io_.HAll + dims_.SeqRow(prev, d_, b) * hidden + units.begin, count, h_prev);
        } else if (io_.initial_h) {
          std::copy_n(io_.initial_h + state + units.begin, count, h_prev);
        } else {
          std::fill_n(h_prev, count, T(0));
        }
      }
      const T* cp = PreviousCell(t, b) + units.begin;
      const T* cell = io_.CAll + seq_row * hidden + units.begin;
      const T* gate = io_.IOFC + seq_row * width_;
      const T* gi = gate + units.begin;
      const T* go = gate + hidden + units.begin;
      const T* gf = gate + 2 * hidden + units.begin;
      const T* gc = gate + 3 * hidden + units.begin;
      T* dpre_i = dpre + units.begin;
      T* dpre_o = dpre + hidden + units.begin;
      T* dpre_f = dpre + 2 * hidden + units.begin;
      T* dpre_c = dpre + 3 * hidden + units.begin;
      T* grad_h = scratch_.grad_h.get() + b * hidden + units.begin;
      T* grad_c = scratch_.grad_c.get() + b * hidden + units.begin;
      const T* grad_hall = io_.grad_HAll ? io_.grad_HAll + seq_row * hidden + units.begin : nullptr;
      if (standard_cell_) {
        StandardCellBackward(
            StandardCellGradRow<T>{{gi, go, gf, gc}, cell, cp, grad_hall, grad_h, grad_c, {dpre_i, dpre_o, dpre_f, dpre_c}},
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
    // dB: this task owns these columns of its group's sums at every step, so it adds them without
    // a second pass.
    T* grad_bias = scratch_.grad_bias.get() + (task / split_.unit_blocks) * width_;
    for (int64_t b = rows.begin; b < rows.end; ++b) {
      if (t >= Length(b)) continue;
      const T* dpre = GradRow(t, b);
      for (int64_t g = 0; g < 4; ++g) {
        const int64_t first = g * hidden + units.begin;
        for (int64_t j = first; j < first + count; ++j) grad_bias[j] += dpre[j];
      }
    }
  }

  const LstmDims& dims_;
  const LstmConfig& config_;
  const LstmBackwardTensors<T>& io_;
  const int64_t d_;
  const int64_t hidden_size_;
  const int64_t width_;
  const StepSplit split_;  // how the time loop is cut into tasks
  const bool reverse_;
  const T* P_;  // [3H] of this direction, or null
  const GateActivation<T> f_act_;
  const GateActivation<T> g_act_;
  const Activation h_act_;
  // Default activations, no clip, peepholes or input_forget: the fused StandardCellBackward.
  const bool standard_cell_;
  // One direction, layout 0, every sequence full: the rows of H_{t-1} are HAll's rows one step
  // away, so dR reads HAll and initial_h instead of a copy (hidden_prev).
  const bool hidden_from_hall_;
  const int64_t chunk_;    // steps per window of gate gradients
  int64_t window_lo_ = 0;  // the window's first time (lowest t); 0 with one window (X's row order)
  BackwardScratch<T> scratch_;
};

// The two directions of a bidirectional LSTM run as two parallel tasks, each serial inside, only
// when one step is too small to split into blocks of hidden units of 2^17 multiply-adds (the Intel
// VM's MinBlockWork, lstm_math.h) and there are too few batch entries for groups. Otherwise they
// run one after the other, each over the whole executor: about as fast (M-bidir: 34.3 vs 33.7 ms,
// 2 threads) and only one direction's gate gradients [T*N, 4H] are alive at a time. (The forward
// keeps its directions in parallel: its scratch is not LSTMGrad's, and it gains more from it.)
// Not MinBlockWork itself: on AMD Zen 3 blocks of its 2^15 were slower than the directions in
// parallel (S-bidir (16, 8, 64, 64) bwd 0.367 vs 0.297 ms, B1-bidir 3.70 vs 2.97 ms).
template <typename T>
bool DirectionsInParallel(const LstmDims& dims, const Executor& executor) {
  constexpr int64_t kMinBlockWorkBesideDirections = int64_t{1} << 17;
  const StepSplit split = SplitTimeLoop<T>(dims, executor, kMaxGroupWeightBytes);
  return dims.num_directions == 2 && executor.Width() >= 2 && split.row_groups == 1 &&
         StepBlocks(dims, executor, kMinBlockWorkBesideDirections) == 1;
}

}  // namespace

template <typename T>
void LstmBackward(const LstmDims& dims, const LstmConfig& config, const LstmBackwardTensors<T>& tensors,
                  const Executor& executor, const ScratchAllocator& allocator) {
  const bool any_output = tensors.dX || tensors.dW || tensors.dR || tensors.dB || tensors.dH0 || tensors.dC0 ||
                          tensors.dP;
  if (!any_output) return;
  // Padded steps have zero gate gradients, but 0 * NaN is NaN: whatever X holds there must not
  // reach dW, so those rows are zeroed in a copy when there are any.
  const T* x_for_weights = tensors.X;
  Scratch<T> masked_x;
  if (tensors.dW && tensors.sequence_lens &&
      std::any_of(tensors.sequence_lens, tensors.sequence_lens + dims.batch_size,
                  [&](int32_t length) { return length < dims.seq_length; })) {
    const int64_t input_size = dims.input_size;
    masked_x = Scratch<T>(allocator, dims.Rows() * input_size);
    for (int64_t t = 0; t < dims.seq_length; ++t) {
      for (int64_t b = 0; b < dims.batch_size; ++b) {
        const int64_t row = dims.XRow(t, b) * input_size;
        if (t < tensors.sequence_lens[b]) {
          std::copy_n(tensors.X + row, input_size, masked_x.get() + row);
        } else {
          std::fill_n(masked_x.get() + row, input_size, T(0));
        }
      }
    }
    x_for_weights = masked_x.get();
  }
  if (DirectionsInParallel<T>(dims, executor)) {
    // One window each; dX = sum over directions of dpre [T*N, 4H] * W [4H, I] once both are done.
    const SerialExecutor serial;
    const int64_t steps = BackwardDirection<T>::ChunkSteps(dims, true);
    BackwardDirection<T> forward(dims, config, tensors, 0, StepSplit{}, steps, allocator);
    BackwardDirection<T> backward(dims, config, tensors, 1, StepSplit{}, steps, allocator);
    executor.For(2, [&](size_t d) {
      (d == 0 ? forward : backward).Recurrence(serial, x_for_weights, nullptr, T(0));
    });
    forward.WriteBiasGradient();
    backward.WriteBiasGradient();
    if (tensors.dX) {
      const int64_t width = dims.GateWidth();
      for (int64_t d = 0; d < 2; ++d) {
        RecurrentParallelGemm(config.matmul_precision, executor, false, false, dims.Rows(), dims.input_size, width,
                              (d == 0 ? forward : backward).GradGates(), width, tensors.W + d * width * dims.input_size,
                              dims.input_size, d == 0 ? T(0) : T(1), tensors.dX, dims.input_size);
      }
    }
    return;
  }
  const StepSplit split = SplitTimeLoop<T>(dims, executor, kMaxGroupWeightBytes);
  const int64_t chunk = BackwardDirection<T>::ChunkSteps(dims, false);
  for (int64_t d = 0; d < dims.num_directions; ++d) {
    BackwardDirection<T> direction(dims, config, tensors, d, split, chunk, allocator);
    direction.Recurrence(executor, x_for_weights, tensors.dX, d == 0 ? T(0) : T(1));
    direction.WriteBiasGradient();
  }
}

template void LstmBackward<float>(const LstmDims&, const LstmConfig&, const LstmBackwardTensors<float>&,
                                  const Executor&, const ScratchAllocator&);
template void LstmBackward<double>(const LstmDims&, const LstmConfig&, const LstmBackwardTensors<double>&,
                                   const Executor&, const ScratchAllocator&);

}  // namespace ortlstm
