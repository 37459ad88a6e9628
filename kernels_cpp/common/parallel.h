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

// Spins until `counter` reaches `target` or `stop` is set: a pause instruction per try, and the
// processor given up (yield) after the first 512 tries (some microseconds), so that a worker waiting on a
// descheduled one does not hold its core.
inline void WaitUntil(const std::atomic<int64_t>& counter, int64_t target, const std::atomic<bool>& stop) {
  for (int spins = 0; counter.load(std::memory_order_acquire) < target; ++spins) {
    if (stop.load(std::memory_order_relaxed)) return;
    if (spins < 512) {
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

// Runs item(phase, k) for every phase in [0, phases) and task k in [0, tasks), every item of a
// phase after every item of the phase before, in one round of the executor rather than one per
// phase. For a time loop cut into blocks of hidden units (a phase per step): on the AMD Zen 4 a
// round of the session's thread pool (KernelContext_ParallelFor) took about 4 us, twice a batch-1
// step's GEMM, so two blocks per step ran at half the speed of one. Worker `own` takes task `own`
// of each phase first (its block of the weights stays in its core's cache), then any task of the
// phase no worker has taken, then waits for the phase to finish. A worker waits only for items
// that a running worker has taken and whose phase before is complete, so the loop finishes
// however the executor runs its workers, one after another included (the first then runs every
// item). Which worker runs an item never changes its result. An exception thrown by an item skips
// the items not yet started and is rethrown here.
template <typename Item>
void ForPhases(const Executor& executor, int64_t phases, int64_t tasks, const Item& item) {
  if (phases <= 0 || tasks <= 0) return;
  if (phases == 1 || tasks == 1) {
    for (int64_t p = 0; p + 1 < phases; ++p) item(p, 0);
    executor.For(static_cast<std::size_t>(tasks), [&](std::size_t k) { item(phases - 1, static_cast<int64_t>(k)); });
    return;
  }
  // taken[k]: the phases of task k some worker has taken so far.
  std::unique_ptr<std::atomic<int64_t>[]> taken(new std::atomic<int64_t>[static_cast<std::size_t>(tasks)]);
  for (int64_t k = 0; k < tasks; ++k) taken[k].store(0, std::memory_order_relaxed);
  std::atomic<int64_t> done{0};  // items finished, in phase order
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto take_and_run = [&](int64_t p, int64_t k) {
    int64_t expected = p;
    if (!taken[k].compare_exchange_strong(expected, p + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) {
      return;
    }
    if (!failed.load(std::memory_order_relaxed)) {
      try {
        item(p, k);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed.store(true, std::memory_order_relaxed);
      }
    }
    done.fetch_add(1, std::memory_order_release);
  };
  executor.For(static_cast<std::size_t>(tasks), [&](std::size_t own_index) {
    const auto own = static_cast<int64_t>(own_index);
    for (int64_t p = 0; p < phases; ++p) {
      // A worker that starts late skips the phases already finished.
      p = std::max(p, done.load(std::memory_order_acquire) / tasks);
      if (p >= phases) break;
      WaitUntil(done, p * tasks, failed);
      take_and_run(p, own);
      for (int64_t j = 1; j < tasks; ++j) take_and_run(p, (own + j) % tasks);
    }
  });
  if (error) std::rethrow_exception(error);
}

}  // namespace ortlstm
