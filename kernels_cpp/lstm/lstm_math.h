// Entry points of the ORT-free LSTM math: forward (LSTMTraining) and backward (LSTMGrad).
// Inputs are validated by the adapter (ort/); shapes and layouts are in lstm/lstm_dims.h.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/cpu_info.h"
#include "common/parallel.h"
#include "common/scratch.h"
#include "lstm/lstm_config.h"
#include "lstm/lstm_dims.h"

namespace ortlstm {

// Optional tensors are nullptr when absent (inputs) or not requested (outputs).
template <typename T>
struct LstmForwardTensors {
  const T* X = nullptr;
  const T* W = nullptr;
  const T* R = nullptr;
  const T* B = nullptr;
  const int32_t* sequence_lens = nullptr;
  const T* initial_h = nullptr;
  const T* initial_c = nullptr;
  const T* P = nullptr;
  T* HAll = nullptr;
  T* Ht = nullptr;
  T* Ct = nullptr;
  T* CAll = nullptr;
  T* IOFC = nullptr;
};

template <typename T>
struct LstmBackwardTensors {
  const T* X = nullptr;
  const T* W = nullptr;
  const T* R = nullptr;
  const int32_t* sequence_lens = nullptr;
  const T* initial_h = nullptr;
  const T* initial_c = nullptr;
  const T* HAll = nullptr;
  const T* CAll = nullptr;
  const T* IOFC = nullptr;
  const T* grad_HAll = nullptr;
  const T* grad_Ht = nullptr;
  const T* grad_Ct = nullptr;
  const T* P = nullptr;
  T* dX = nullptr;
  T* dW = nullptr;
  T* dR = nullptr;
  T* dB = nullptr;
  T* dH0 = nullptr;
  T* dC0 = nullptr;
  T* dP = nullptr;
};

// The least work of a block of hidden units (StepBlocks), in multiply-adds of one step's recurrent
// GEMM. Measured with a round of the thread pool per step: 2^17 on the Intel VM (AVX-512), where a
// one-row step of 2^16 (B1: 1 x 512 x 128) takes 3 us; 2^15 on AMD Zen 3 (AVX2), where the same step
// takes 7 us and two blocks of it paid for their hand-off every step (fwd + bwd B1 4.23 -> 3.39 ms,
// S (16, 8, 64, 64) 0.385 -> 0.335 ms). Since the steps hand off inside one round (ForPhases,
// common/parallel.h), 2^14 on AMD Zen 4 (AVX-512), 2 threads, f+b in alternating processes:
// GRU B1 (256, 1, 128, 128) 0.91x, LSTM B1 0.77x, GRU (64, 8, 64, 64) 0.91x, GRU S 0.92-1.17x,
// GRU (16, 1, 128, 128) 1.03x. The vector width stands for the CPU; AVX2 was not measured again.
inline int64_t MinBlockWork() { return VectorBytes() >= 64 ? int64_t{1} << 14 : int64_t{1} << 15; }

// How many blocks of hidden units one time step is cut into (forward and backward alike): as
// many as the executor is wide, while each block keeps `min_block_work` multiply-adds of the
// step's recurrent GEMM, enough to pay for a task.
inline int64_t StepBlocks(const LstmDims& dims, const Executor& executor, int64_t min_block_work = MinBlockWork()) {
  const int64_t work = dims.batch_size * dims.GateWidth() * dims.hidden_size;
  int64_t blocks = work / min_block_work;
  if (blocks > executor.Width()) blocks = executor.Width();
  if (blocks > dims.hidden_size) blocks = dims.hidden_size;
  return blocks < 1 ? 1 : blocks;
}

// How the time loop is cut into executor tasks. Batch entries are independent through the whole
// recurrence, so with enough of them each task takes a group of entries (rows) for all steps:
// one round of tasks per time loop, each task multiplying its rows by the whole of R. Otherwise
// each step is cut into blocks of hidden units (StepBlocks), one round of tasks per step. At most
// one of the two counts is above 1.
struct StepSplit {
  int64_t row_groups = 1;
  int64_t unit_blocks = 1;

  int64_t Tasks() const { return row_groups * unit_blocks; }
  // The hidden units and the batch entries of task k.
  Range Units(int64_t hidden_size, int64_t k) const { return SplitRange(hidden_size, unit_blocks, k % unit_blocks); }
  Range Rows(int64_t batch_size, int64_t k) const { return SplitRange(batch_size, row_groups, k / unit_blocks); }
  // Steps a round of tasks runs: one when a step is cut into blocks of units (each needs every
  // block's previous step), else as many as there are (`steps`).
  int64_t StepsPerRound(int64_t steps) const { return unit_blocks > 1 || steps < 1 ? 1 : steps; }
};
// Groups are taken only while R (4H x H elements of T) is at most `max_group_weight_bytes`: each
// task reads all of R every step, which pays while R stays in a core's cache. The forward passes
// the L2 size read at run time (common/cpu_info.h): on the Intel VM (2 MiB) groups at M, blocks
// at L, whose 4 MiB of R streamed from L3 every step made groups no faster; on AMD Zen 3 (512 KB)
// blocks at M too, each task with half of R^T and 32-row GEMMs (forward 16.9 -> 16.0 ms). The
// backward keeps 2 MiB (recurrent/backward_driver.h).
//
// Below two groups of 8, a small step still takes groups, of 4 entries (`small_groups`): its
// blocks' hand-off every step costs more than the GEMM loses at 4 rows, and more still when the
// two cores are far apart (docs/performance.md). AMD Zen 4, 2 threads, f+b, steady states: GRU S
// (16, 8, 64, 64) 202 -> 174 us near, 455-529 -> 353-357 us far; LSTM S 228 -> 194 near, 470 ->
// 341 far; RNN S 81 -> 65; GRU (16, 12, 64, 64) 297 -> 257. At 8 x 384 x 128 (GRU, 2^18.6
// multiply-adds a step) the two were even (1275 vs 1250 us), at LSTM's 8 x 512 x 128 (2^19) blocks
// were faster (1470 vs 1550), and at 8 x 1024 x 256 faster still: hence steps up to 2^18.
inline constexpr int64_t kMinGroupRows = 8;  // rows per task for the recurrent GEMM to run at full speed
inline constexpr int64_t kMinSmallGroupRows = 4;
inline constexpr int64_t kMaxSmallGroupStepWork = int64_t{1} << 18;

template <typename T>
inline StepSplit SplitTimeLoop(const LstmDims& dims, const Executor& executor, int64_t max_group_weight_bytes,
                               bool small_groups = true) {
  if (dims.GateWidth() * dims.hidden_size * static_cast<int64_t>(sizeof(T)) > max_group_weight_bytes) {
    return StepSplit{1, StepBlocks(dims, executor)};
  }
  const auto groups_of = [&](int64_t rows) { return std::min<int64_t>(dims.batch_size / rows, executor.Width()); };
  if (groups_of(kMinGroupRows) >= 2) return StepSplit{groups_of(kMinGroupRows), 1};
  if (small_groups && dims.batch_size * dims.GateWidth() * dims.hidden_size <= kMaxSmallGroupStepWork &&
      groups_of(kMinSmallGroupRows) >= 2) {
    return StepSplit{groups_of(kMinSmallGroupRows), 1};
  }
  return StepSplit{1, StepBlocks(dims, executor)};
}

// Work is split into tasks of `executor`; the BLAS must be single-threaded (common/blas.h).
// Scratch memory comes from `allocator`; std::bad_alloc propagates when it runs out.
template <typename T>
void LstmForward(const LstmDims& dims, const LstmConfig& config, const LstmForwardTensors<T>& tensors,
                 const Executor& executor, const ScratchAllocator& allocator);

template <typename T>
void LstmBackward(const LstmDims& dims, const LstmConfig& config, const LstmBackwardTensors<T>& tensors,
                  const Executor& executor, const ScratchAllocator& allocator);

}  // namespace ortlstm
