// GRU forward for GRUTraining: the recurrent family's second cell policy (GruForwardCell) on the
// shared time loop (recurrent/forward_driver.h), which projects X for all steps (X W^T, gates z r
// h), runs each step's recurrent GEMMs into the cell's rows and cuts the loop into tasks as it does
// the LSTM's (groups of batch entries, or blocks of hidden units: z, r, h of a block in turn).
// Layouts: lstm/lstm_dims.h (gates = 3).
//
//   z = f(Xt Wz^T + Ht-1 Rz^T + Wbz + Rbz)          (clip, when set, before f and g)
//   r = f(Xt Wr^T + Ht-1 Rr^T + Wbr + Rbr)
//   h = g(Xt Wh^T + (r . Ht-1) Rh^T + Rbh + Wbh)     linear_before_reset = 0
//   h = g(Xt Wh^T + r . (Ht-1 Rh^T + Rbh) + Wbh)     linear_before_reset = 1
//   Ht = (1 - z) . h + z . Ht-1
//
// How the step's recurrent GEMM is split: with linear_before_reset = 1 one stage, H_{t-1} times all
// of R; with 0 two, H_{t-1} Rzr^T, then after r the pass builds r . H_{t-1} for (r . H_{t-1}) Rh^T.
// An entry past its sequence length passes its state through and its outputs of that step are
// zero (as the LSTM's are).
#include <algorithm>
#include <memory>

#include "gru/gru_math.h"
#include "lstm/gate_math.h"
#include "lstm/vector_loops.h"
#include "recurrent/forward_driver.h"

namespace ortlstm {
namespace {

// The pointwise loops of a step over n units, with restrict pointers (every row is a different
// buffer or a disjoint part of one), inlined into the clones below (lstm/vector_loops.h:
// AVX-512, AVX2 or baseline, the same bits).
// a += wb + rb + rec (z and r before their activation).
template <typename T>
inline __attribute__((always_inline)) void PreactivationLoop(const T* __restrict wb, const T* __restrict rb,
                                                             const T* __restrict rec, T* __restrict a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) a[j] = a[j] + wb[j] + rb[j] + rec[j];
}

// h's pre-activation: hh + wb + r . (q + rb) with linear_before_reset = 1, else hh + wb + rb + q.
template <typename T>
inline __attribute__((always_inline)) void CandidateLoop(bool linear_before_reset, const T* __restrict wb,
                                                         const T* __restrict rb, const T* __restrict r,
                                                         const T* __restrict q, T* __restrict hh, int64_t n) {
  if (linear_before_reset) {
    for (int64_t j = 0; j < n; ++j) hh[j] = hh[j] + wb[j] + r[j] * (q[j] + rb[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) hh[j] = hh[j] + wb[j] + rb[j] + q[j];
  }
}

// H_t = (1 - z) . hh + z . H_{t-1}
template <typename T>
inline __attribute__((always_inline)) void HiddenLoop(const T* __restrict z, const T* __restrict hh,
                                                      const T* __restrict h_prev, T* __restrict h_out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) h_out[j] = (T(1) - z[j]) * hh[j] + z[j] * h_prev[j];
}

}  // namespace

#define ORTLSTM_GRU_ROW_CLONES(T)                                                                                 \
  ORTLSTM_VECTOR_CLONES void GruPreactivations(const T* wb, const T* rb, const T* rec, T* a, int64_t n) {       \
    PreactivationLoop(wb, rb, rec, a, n);                                                                       \
  }                                                                                                             \
  ORTLSTM_VECTOR_CLONES void GruCandidate(bool linear_before_reset, const T* wb, const T* rb, const T* r,       \
                                          const T* q, T* hh, int64_t n) {                                       \
    CandidateLoop(linear_before_reset, wb, rb, r, q, hh, n);                                                    \
  }                                                                                                             \
  ORTLSTM_VECTOR_CLONES void GruHidden(const T* z, const T* hh, const T* h_prev, T* h_out, int64_t n) {         \
    HiddenLoop(z, hh, h_prev, h_out, n);                                                                        \
  }
ORTLSTM_GRU_ROW_CLONES(float)
ORTLSTM_GRU_ROW_CLONES(double)
#undef ORTLSTM_GRU_ROW_CLONES

namespace {

template <typename T>
class GruForwardCell {
 public:
  static constexpr int64_t kGates = 3;
  static constexpr bool kAccumulate = false;  // the GEMMs write rec_: h needs its recurrent term apart

  GruForwardCell(const LstmDims& dims, const GruConfig& config, const GruForwardTensors<T>& io, int64_t d,
                 StepSplit split, const ScratchAllocator& allocator)
      : H_(dims.hidden_size),
        width_(dims.GateWidth()),
        lbr_(config.linear_before_reset),
        f_(config.cell.activations[d].f),
        g_(config.cell.activations[d].g),
        clip_(config.cell.clip.has_value()),
        threshold_(clip_ ? static_cast<T>(*config.cell.clip) : T(0)),
        io_(io),
        bias_(allocator, 2 * width_),
        rec_(allocator, dims.batch_size * width_),
        rh_(allocator, lbr_ ? 0 : dims.batch_size * H_) {
    for (int64_t row = 0; row < width_; ++row) {
      const int64_t to = BlockMajorRow(row, kGates, H_, split.unit_blocks);
      bias_.get()[to] = io.B ? io.B[d * 2 * width_ + row] : T(0);
      bias_.get()[width_ + to] = io.B ? io.B[d * 2 * width_ + width_ + row] : T(0);
    }
  }

  int64_t Stages() const { return lbr_ ? 1 : 2; }
  Range StageGates(int64_t s) const { return lbr_ ? Range{0, 3} : (s == 0 ? Range{0, 2} : Range{2, 3}); }
  const T* StageInput(int64_t) const { return rh_.get(); }
  T* StageOutput(int64_t b) const { return rec_.get() + b * width_; }
  void InitialState(int64_t) {}
  void FinalState(int64_t, bool) {}

  void Inactive(int64_t, int64_t, int64_t seq_row, Range units) {
    if (!io_.ZRH) return;
    for (int64_t g = 0; g < kGates; ++g) {
      std::fill_n(io_.ZRH + seq_row * width_ + g * H_ + units.begin, units.end - units.begin, T(0));
    }
  }

  // Stage 0 activates z and r (and with linear_before_reset = 1 finishes the step); stage 1 the rest.
  void Pointwise(int64_t s, int64_t, int64_t b, Range units, const ForwardRow<T>& row) {
    const int64_t count = units.end - units.begin;
    const T* wb = bias_.get() + kGates * units.begin;
    const T* rb = wb + width_;
    const T* rec = rec_.get() + b * width_ + kGates * units.begin;
    T* a = row.gates;  // z, r, h of the block, activated in place
    if (s == 0) {
      GruPreactivations(wb, rb, rec, a, 2 * count);
      if (clip_) ClipInPlace(a, 2 * count, threshold_);
      ApplyInPlace(f_, a, 2 * count);
      if (!lbr_) {
        T* rh = rh_.get() + b * H_ + units.begin;
        for (int64_t j = 0; j < count; ++j) rh[j] = a[count + j] * row.h_prev[j];
        return;
      }
    }
    const T* z = a;
    const T* r = a + count;
    T* hh = a + 2 * count;
    const T* q = rec + 2 * count;
    const int64_t h = 2 * count;
    GruCandidate(lbr_, wb + h, rb + h, r, q, hh, count);
    if (clip_) ClipInPlace(hh, count, threshold_);
    ApplyInPlace(g_, hh, count);
    GruHidden(z, hh, row.h_prev, row.h_out, count);
    if (io_.ZRH && !row.gates_in_stash) {
      for (int64_t g = 0; g < kGates; ++g) {
        std::copy_n(a + g * count, count, io_.ZRH + row.seq_row * width_ + g * H_ + units.begin);
      }
    }
  }

 private:
  const int64_t H_;
  const int64_t width_;
  const bool lbr_;  // linear_before_reset
  const Activation f_;
  const Activation g_;
  const bool clip_;
  const T threshold_;
  const GruForwardTensors<T>& io_;
  Scratch<T> bias_;  // [2, 3H] Wb, Rb, block-major gate order
  Scratch<T> rec_;   // [N, 3H] the step's recurrent products, block-major
  Scratch<T> rh_;    // [N, H] r . H_{t-1} (linear_before_reset = 0)
};

}  // namespace

template <typename T>
void GruForward(const LstmDims& dims, const GruConfig& config, const GruForwardTensors<T>& tensors,
                const Executor& executor, const ScratchAllocator& allocator) {
  const ForwardIo<T> io = ForwardIoOf<T>(tensors, tensors.ZRH, config.cell.matmul_precision);
  RunForward<T, GruForwardCell<T>>(dims, io, {config.cell.IsReverse(0), config.cell.IsReverse(1)}, executor,
                                   allocator, [&](int64_t d, StepSplit split) {
                                     return std::make_unique<GruForwardCell<T>>(dims, config, tensors, d, split,
                                                                                allocator);
                                   });
}

template void GruForward<float>(const LstmDims&, const GruConfig&, const GruForwardTensors<float>&, const Executor&,
                                const ScratchAllocator&);
template void GruForward<double>(const LstmDims&, const GruConfig&, const GruForwardTensors<double>&,
                                 const Executor&, const ScratchAllocator&);

}  // namespace ortlstm
