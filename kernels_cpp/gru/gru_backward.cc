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
// The cell is a policy of the shared backward time loop (recurrent/backward_driver.h: windows of
// steps, the task split, the carry through R, dX, dW, dB and the directions are the driver's); it
// holds its pointwise step, its carry rows ([dz dr dq], or [dz dr] of the gate gradients with
// K = 2H), and per window the GEMMs that need no dL/dH: Q before the window's steps, dR after.
// With linear_before_reset = 1 every value of a step is per unit, so a step may be cut into
// blocks of units; with 0, d(r . H_{t-1}) = da Rh needs a whole row of da first: groups of
// entries only.
#include <algorithm>
#include <array>
#include <memory>
#include <vector>

#include "common/blas.h"
#include "gru/gru_math.h"
#include "lstm/gate_math.h"
#include "lstm/lstm_math.h"
#include "lstm/vector_loops.h"
#include "recurrent/backward_driver.h"
#include "recurrent/recurrent_gemm.h"

namespace ortlstm {
namespace {

// The pointwise passes of a step over n units, as free functions with restrict pointers (every
// row is a different buffer or a disjoint part of one): without them GCC left the loops scalar.
// Inlined into the clones below (lstm/vector_loops.h: AVX-512, AVX2 or baseline, the same bits).
// dH = dL/dH_t (carried) + grad_HAll; dz, da; dL/dH_{t-1} through z into dhp.
template <typename T>
inline __attribute__((always_inline)) void UpdateGateGradientsLoop(
    int64_t n, const T* __restrict grad_hall, const T* __restrict hp, const T* __restrict hh, const T* __restrict z,
    const T* __restrict fprime, const T* __restrict gprime, T* __restrict dz, T* __restrict da, T* __restrict dhp) {
  for (int64_t i = 0; i < n; ++i) {
    const T dH = dhp[i] + grad_hall[i];
    dz[i] = dH * (hp[i] - hh[i]) * fprime[i];
    da[i] = dH * (T(1) - z[i]) * gprime[i];
    dhp[i] = dH * z[i];
  }
}

// linear_before_reset = 1: dr = da . (Q + Rbh) . f'(r), and the carry rows [dz dr dq], dq = da . r.
template <typename T>
inline __attribute__((always_inline)) void ResetGateGradientsLoop(int64_t n, const T* __restrict da,
                                                                  const T* __restrict q, const T* __restrict rbh,
                                                                  const T* __restrict r, const T* __restrict fprime,
                                                                  const T* __restrict dz, T* __restrict dr,
                                                                  T* __restrict rec_z, T* __restrict rec_r,
                                                                  T* __restrict rec_q) {
  for (int64_t i = 0; i < n; ++i) {
    const T value = da[i] * (q[i] + rbh[i]) * fprime[i];
    dr[i] = value;
    rec_z[i] = dz[i];
    rec_r[i] = value;
    rec_q[i] = da[i] * r[i];
  }
}

}  // namespace

#define ORTLSTM_GRU_ROW_CLONES(T)                                                                                     \
  ORTLSTM_VECTOR_CLONES void GruUpdateGateGradients(int64_t n, const T* grad_hall, const T* hp, const T* hh,        \
                                                    const T* z, const T* fprime, const T* gprime, T* dz, T* da,     \
                                                    T* dhp) {                                                       \
    UpdateGateGradientsLoop(n, grad_hall, hp, hh, z, fprime, gprime, dz, da, dhp);                                \
  }                                                                                                               \
  ORTLSTM_VECTOR_CLONES void GruResetGateGradients(int64_t n, const T* da, const T* q, const T* rbh, const T* r,    \
                                                   const T* fprime, const T* dz, T* dr, T* rec_z, T* rec_r,         \
                                                   T* rec_q) {                                                      \
    ResetGateGradientsLoop(n, da, q, rbh, r, fprime, dz, dr, rec_z, rec_r, rec_q);                                 \
  }
ORTLSTM_GRU_ROW_CLONES(float)
ORTLSTM_GRU_ROW_CLONES(double)
#undef ORTLSTM_GRU_ROW_CLONES

namespace {

template <typename T>
class GruBackwardCell {
 public:
  static constexpr int64_t kGates = 3;

  GruBackwardCell(const BackwardLoop<T>& loop, const GruConfig& config, const GruBackwardTensors<T>& io,
                  const ScratchAllocator& allocator)
      : loop_(loop),
        config_(config),
        io_(io),
        H_(loop.hidden),
        width_(loop.width),
        lbr_(config.linear_before_reset),
        R_(io.R + loop.d * width_ * H_),
        rb_(io.B ? io.B + loop.d * 2 * width_ + width_ : nullptr),
        f_(config.cell.activations[loop.d].f, config.cell.clip),
        g_(config.cell.activations[loop.d].g, config.cell.clip),
        hidden_prev_(allocator, loop.WindowRows() * H_),
        grad_rec_(allocator, lbr_ ? loop.WindowRows() * width_ : 0),
        q_(allocator, lbr_ ? loop.WindowRows() * H_ : 0),
        reset_hidden_(allocator, lbr_ ? 0 : loop.WindowRows() * H_),
        d_rh_(allocator, lbr_ ? 0 : loop.dims.batch_size * H_),
        prime_(allocator, loop.split.Tasks() * 2 * H_),
        zeros_(allocator, H_) {
    std::fill_n(zeros_.get(), H_, T(0));
    if (!lbr_) {
      // Rh for d(r . H_{t-1}) = da Rh, once per group of entries and op call (a bf16 operand
      // rounds it here; groups only: RunBackward takes no blocks of units for this cell).
      for (int64_t k = 0; k < loop.split.Tasks(); ++k) {
        const Range rows = loop.split.Rows(loop.dims.batch_size, k);
        reset_hidden_weights_.emplace_back(config.cell.matmul_precision, false, false,
                                           std::max<int64_t>(rows.end - rows.begin, 0), H_, H_, R_ + 2 * H_ * H_, H_);
      }
    }
  }

  // dH_{t-1} += [dz dr dq] R (linear_before_reset = 1), [dz dr] R[zr] (0).
  int64_t CarryDepth() const { return lbr_ ? width_ : 2 * H_; }
  const T* CarryRow(int64_t t) const { return lbr_ ? RecRow(t, 0) : loop_.GradRow(t, 0); }
  bool SeparateRecurrentBias() const { return lbr_; }
  const T* RecurrentBiasRow(int64_t t, int64_t b) const { return RecRow(t, b); }
  void InitialGradState(int64_t, bool) {}
  void FinalGradState(int64_t) {}

  // H_{t-1} of the window's steps, and with linear_before_reset = 1 Q = H_{t-1} Rh^T for all of
  // them at once.
  void BeginWindow(int64_t lo, int64_t hi, const Executor& executor) {
    GatherHiddenPrev(loop_, lo, hi, hidden_prev_.get(), executor);
    const int64_t rows = (hi - lo) * loop_.dims.batch_size;
    if (lbr_) {
      RecurrentParallelGemm(config_.cell.matmul_precision, executor, false, true, rows, H_, H_, hidden_prev_.get(), H_,
                            R_ + 2 * H_ * H_, H_, T(0), q_.get(), H_);
    }
  }

  void Inactive(int64_t t, int64_t b, Range units) {
    const int64_t count = units.end - units.begin;
    if (lbr_) {
      for (int64_t g = 0; g < kGates; ++g) std::fill_n(RecRow(t, b) + g * H_ + units.begin, count, T(0));
    } else {
      std::fill_n(reset_hidden_.get() + loop_.WindowRow(t, b) * H_ + units.begin, count, T(0));
    }
  }

  // Step t for the active entries of `rows`, units `units` (all of them unless
  // linear_before_reset = 1): GradH() holds their dL/dH_t (the carried part) and gets the part of
  // dL/dH_{t-1} that does not go through R.
  void Step(int64_t t, Range units, Range rows, int64_t task) {
    const int64_t H = H_;
    const int64_t count = units.end - units.begin;
    const int64_t u = units.begin;
    T* fprime = prime_.get() + task * 2 * H;
    T* gprime = fprime + H;
    for (int64_t b = rows.begin; b < rows.end; ++b) {
      if (!loop_.Active(t, b)) continue;
      const int64_t seq_row = loop_.dims.SeqRow(t, loop_.d, b);
      T* dg = loop_.GradRow(t, b);
      T* dhp = loop_.GradH() + b * H + u;
      const T* z = io_.ZRH + seq_row * width_;
      const T* r = z + H;
      const T* hh = z + 2 * H;
      const T* hp = hidden_prev_.get() + loop_.WindowRow(t, b) * H;
      const T* grad_hall = (io_.grad_HAll ? io_.grad_HAll + seq_row * H : zeros_.get()) + u;
      f_.DerivativesFromOutputs(z + u, fprime, count);
      g_.DerivativesFromOutputs(hh + u, gprime, count);
      GruUpdateGateGradients(count, grad_hall, hp + u, hh + u, z + u, fprime, gprime, dg + u, dg + 2 * H + u, dhp);
      if (lbr_) {
        f_.DerivativesFromOutputs(r + u, fprime, count);
        const T* q = q_.get() + loop_.WindowRow(t, b) * H;
        const T* rbh = rb_ ? rb_ + 2 * H : zeros_.get();
        T* dq = RecRow(t, b);
        GruResetGateGradients(count, dg + 2 * H + u, q + u, rbh + u, r + u, fprime, dg + u, dg + H + u, dq + u, dq + H + u,
                           dq + 2 * H + u);
      } else {
        T* rhp = reset_hidden_.get() + loop_.WindowRow(t, b) * H;
        for (int64_t j = 0; j < H; ++j) rhp[j] = r[j] * hp[j];
      }
    }
    if (lbr_) return;
    // d(r . H_{t-1}) = da Rh (the rows past their length have da = 0); then the reset gate's share.
    const int64_t M = rows.end - rows.begin;
    if (M <= 0) return;
    const int64_t step_ld = loop_.dims.BatchStride() * width_;
    T* d_rh = d_rh_.get();
    reset_hidden_weights_[task].Multiply(loop_.GradRow(t, rows.begin) + 2 * H, step_ld, T(0), d_rh + rows.begin * H, H,
                                         M);
    for (int64_t b = rows.begin; b < rows.end; ++b) {
      if (!loop_.Active(t, b)) continue;
      const T* r = io_.ZRH + loop_.dims.SeqRow(t, loop_.d, b) * width_ + H;
      const T* hp = hidden_prev_.get() + loop_.WindowRow(t, b) * H;
      T* dg = loop_.GradRow(t, b);
      T* dhp = loop_.GradH() + b * H;
      f_.DerivativesFromOutputs(r, fprime, H);
      for (int64_t j = 0; j < H; ++j) {
        dg[H + j] = d_rh[b * H + j] * hp[j] * fprime[j];
        dhp[j] += d_rh[b * H + j] * r[j];
      }
    }
  }

  // The window's share of dR: [dz dr dq]^T H_{t-1} (linear_before_reset = 1), else
  // [dz dr]^T H_{t-1} and da^T (r . H_{t-1}).
  void AddWindowGradients(int64_t lo, int64_t hi, bool first, const Executor& executor) const {
    if (!io_.dR) return;
    const int64_t H = H_;
    const int64_t rows = (hi - lo) * loop_.dims.batch_size;
    const T beta = first ? T(0) : T(1);
    const MatmulPrecision precision = config_.cell.matmul_precision;
    T* dR = io_.dR + loop_.d * width_ * H;
    if (lbr_) {
      RecurrentParallelGemm(precision, executor, true, false, width_, H, rows, grad_rec_.get(), width_,
                            hidden_prev_.get(), H, beta, dR, H);
    } else {
      const T* dg = loop_.GradGates();
      RecurrentParallelGemm(precision, executor, true, false, 2 * H, H, rows, dg, width_, hidden_prev_.get(), H, beta,
                            dR, H);
      RecurrentParallelGemm(precision, executor, true, false, H, H, rows, dg + 2 * H, width_, reset_hidden_.get(), H,
                            beta, dR + 2 * H * H, H);
    }
  }

 private:
  // Row (t, b) [3H] of the window's dz, dr, dq (linear_before_reset = 1).
  T* RecRow(int64_t t, int64_t b) const { return grad_rec_.get() + loop_.WindowRow(t, b) * width_; }

  const BackwardLoop<T>& loop_;
  const GruConfig& config_;
  const GruBackwardTensors<T>& io_;
  const int64_t H_;
  const int64_t width_;
  const bool lbr_;  // linear_before_reset
  const T* R_;      // [3H, H] of this direction
  const T* rb_;     // [3H] Rb of this direction, or null
  const GateActivation<T> f_;
  const GateActivation<T> g_;
  Scratch<T> hidden_prev_;   // [window rows, H] H_{t-1} of each step
  Scratch<T> grad_rec_;      // [window rows, 3H] dz, dr, dq (linear_before_reset = 1)
  Scratch<T> q_;             // [window rows, H] H_{t-1} Rh^T (linear_before_reset = 1)
  Scratch<T> reset_hidden_;  // [window rows, H] r . H_{t-1} (linear_before_reset = 0)
  Scratch<T> d_rh_;          // [N, H] dL/d(r . H_{t-1}) (linear_before_reset = 0)
  Scratch<T> prime_;         // [tasks, 2H] f' and g' of one entry's block, one row per task
  // [H] zeros for an absent grad_HAll or Rb: the step's loops then read a row either way and
  // vectorize (a load under a condition kept GCC from vectorizing them), adding the same 0 as before.
  Scratch<T> zeros_;
  std::vector<StepOperand<T>> reset_hidden_weights_;  // per task: Rh (linear_before_reset = 0)
};

}  // namespace

// Blocks of units only with linear_before_reset = 1 (above). Two directions always as two tasks:
// with the LSTM's rule (one after the other, each in groups of entries) M-bidir (64, 32, 256,
// 256) took 1.15-1.2x as long at 2 threads, a step's GEMMs being a third smaller than the LSTM's.
// One window of gate gradients: with windows of 512 rows M took 1.16-1.19x as long at 2 threads
// (and 0.99x at 1). Both on AMD EPYC, 2 cores, loaded: medians of interleaved rounds.
template <typename T>
void GruBackward(const LstmDims& dims, const GruConfig& config, const GruBackwardTensors<T>& tensors,
                 const Executor& executor, const ScratchAllocator& allocator) {
  const BackwardIo<T> io = BackwardIoOf<T>(tensors, config.cell.matmul_precision);
  RunBackward<T, GruBackwardCell<T>>(dims, io, {config.cell.IsReverse(0), config.cell.IsReverse(1)},
                                     BackwardTasks{config.linear_before_reset, true, false}, executor, allocator,
                                     [&](const BackwardLoop<T>& loop) {
                                       return std::make_unique<GruBackwardCell<T>>(loop, config, tensors, allocator);
                                     });
}

template void GruBackward<float>(const LstmDims&, const GruConfig&, const GruBackwardTensors<float>&,
                                 const Executor&, const ScratchAllocator&);
template void GruBackward<double>(const LstmDims&, const GruConfig&, const GruBackwardTensors<double>&,
                                  const Executor&, const ScratchAllocator&);

}  // namespace ortlstm
