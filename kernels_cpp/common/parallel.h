// The only threading site: work is split into tasks that an executor runs, possibly in
// parallel. The ORT adapter supplies an executor backed by the session's intra-op thread pool
// (KernelContext_ParallelFor); BLAS runs single-threaded inside tasks, so there is one owner of
// threads. Task boundaries are fixed by the caller, never by timing, so results do not depend
// on which thread ran what.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace ortlstm {

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs task(i) for every i in [0, count) and returns when all have finished.
  virtual void For(std::size_t count, const std::function<void(std::size_t)>& task) const = 0;
  // How many tasks it is worth splitting work into.
  virtual int Width() const = 0;
};

// Runs tasks one after another on the calling thread.
class SerialExecutor final : public Executor {
 public:
  void For(std::size_t count, const std::function<void(std::size_t)>& task) const override {
    for (std::size_t i = 0; i < count; ++i) task(i);
  }
  int Width() const override { return 1; }
};

// [begin, end) of part `index` when `total` items are cut into `parts` nearly equal pieces.
struct Range {
  int64_t begin;
  int64_t end;
};
inline Range SplitRange(int64_t total, int64_t parts, int64_t index) {
  const int64_t base = total / parts;
  const int64_t extra = total % parts;
  const int64_t begin = index * base + (index < extra ? index : extra);
  return Range{begin, begin + base + (index < extra ? 1 : 0)};
}

// Runs item(phase, k) for every phase in [0, phases) and task k in [0, tasks), every item of a
// phase after every item of the phase before, in one round of the executor rather than one per
// phase. For a time loop cut into blocks of hidden units (a phase per step): on the AMD Zen 4 a
// round of the session's thread pool (KernelContext_ParallelFor) took about 4 us, twice a batch-1
// step's GEMM, so two blocks per step ran at half the speed of one. Worker `own` runs task `own`
// of each phase once every task has finished the phase before, and while it waits for a task
// that has not even started its item of that phase, it runs that item itself (after a short
// spin, so that a worker that is merely a little behind keeps its own items). A worker waits only
// for items that a running worker has taken and whose phase before is complete, so the loop
// finishes however the executor runs its workers, one after another included (the first then runs
// every item). Which worker runs an item never changes its result. An exception thrown by an
// item skips the items not yet started and is rethrown here.
//
// Each task's counters (taken, finished) sit on cache lines of their own, written by the worker
// that runs the item: in the common case a hand-off is one store to a worker's own line and one
// read of it by the others. Shared counters, changed by every worker every phase, moved their line
// between the cores several times a step; when the VM's two vCPUs sat on distant cores (a round
// trip of ~320 instead of ~56 ns: docs/performance.md) that doubled a batch-1 step.
template <typename Item>
void ForPhases(const Executor& executor, int64_t phases, int64_t tasks, const Item& item) {
  if (phases <= 0 || tasks <= 0) return;
  if (phases == 1 || tasks == 1) {
    for (int64_t p = 0; p + 1 < phases; ++p) item(p, 0);
    executor.For(static_cast<std::size_t>(tasks), [&](std::size_t k) { item(phases - 1, static_cast<int64_t>(k)); });
    return;
  }
  struct alignas(64) Counter {
    std::atomic<int64_t> value{0};
  };
  // taken[k]: the phases of task k some worker has taken; finished[k]: those it has finished (the
  // items of a task run in phase order, one worker at a time).
  std::unique_ptr<Counter[]> taken(new Counter[static_cast<std::size_t>(tasks)]);
  std::unique_ptr<Counter[]> finished(new Counter[static_cast<std::size_t>(tasks)]);
  struct alignas(64) Flag {
    std::atomic<bool> value{false};
  } failed;
  std::mutex error_mutex;
  std::exception_ptr error;
  // Runs item (p, k) unless some worker has taken it.
  auto take_and_run = [&](int64_t p, int64_t k) {
    int64_t expected = p;
    if (!taken[k].value.compare_exchange_strong(expected, p + 1, std::memory_order_acq_rel,
                                                std::memory_order_relaxed)) {
      return;
    }
    if (!failed.value.load(std::memory_order_relaxed)) {
      try {
        item(p, k);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed.value.store(true, std::memory_order_relaxed);
      }
    }
    finished[k].value.store(p + 1, std::memory_order_release);
  };
  // Until every task has finished phase p - 1: spins on each unfinished task's counter, running
  // its item if no worker has taken it after kSpinsBeforeTaking tries; gives up the processor
  // (yield) after 512 tries (some microseconds), so that a worker waiting on a descheduled one
  // does not hold its core.
  constexpr int kSpinsBeforeTaking = 32;
  auto finish_phase_before = [&](int64_t p) {
    for (int64_t j = 0; j < tasks; ++j) {
      for (int spins = 0; finished[j].value.load(std::memory_order_acquire) < p; ++spins) {
        if (spins == kSpinsBeforeTaking && taken[j].value.load(std::memory_order_relaxed) == p - 1) {
          take_and_run(p - 1, j);
        } else if (spins < 512) {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#elif defined(__aarch64__)
          asm volatile("yield");
#endif
        } else {
          std::this_thread::yield();
        }
      }
    }
  };
  executor.For(static_cast<std::size_t>(tasks), [&](std::size_t own_index) {
    const auto own = static_cast<int64_t>(own_index);
    // A worker that starts late skips the phases every task has finished.
    int64_t p = phases;
    for (int64_t j = 0; j < tasks; ++j) p = std::min(p, finished[j].value.load(std::memory_order_acquire));
    for (; p < phases; ++p) {
      if (p > 0) finish_phase_before(p);
      take_and_run(p, own);
    }
  });
  if (error) std::rethrow_exception(error);
}

}  // namespace ortlstm
