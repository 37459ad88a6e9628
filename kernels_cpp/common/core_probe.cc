// How far apart two CPUs are, as C functions for benchmarks through ctypes (benchmarks/bench_lstm.py,
// scripts/core_round_trip.py); they need no ONNX Runtime. Exported by cmake/ortlstm_ops.map; no kernel
// calls them.
//
// A time loop cut into blocks of units hands a cache line from one core to another at every step,
// so the small sizes' speed follows the cores' distance. On a VM that distance moves: on the 2-vCPU
// AMD Zen 4 a round trip took 56 ns for seconds to minutes, then about 320 ns (docs/performance.md),
// and GRU B1 f+b took 1.4 or 2.5 ms with it. A benchmark that records it can tell the two apart.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

namespace {

bool Pin(int cpu) {
#if defined(__linux__)
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
#else
  (void)cpu;
  return false;
#endif
}

}  // namespace

// The median over batches of 2000 round trips of a cache line between a thread pinned to cpu_a
// and one pinned to cpu_b (each hands a counter to the other), in ns per round trip, for about
// `seconds`; -1 if either thread cannot be pinned there (no such CPU, the same CPU twice, or not
// Linux), or if a round trip takes 100 us (the two threads then take turns on one core: another
// process holds the other). The calling thread stays pinned to cpu_a only while the call runs.
extern "C" __attribute__((visibility("default"))) double OrtLstmCoreRoundTripNs(int cpu_a, int cpu_b,
                                                                                double seconds) {
#if defined(__linux__)
  cpu_set_t saved;
  if (pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved) != 0) return -1.0;
  if (cpu_a == cpu_b || !Pin(cpu_a)) return -1.0;
  constexpr long kBatch = 2000;
  struct alignas(64) Line {
    std::atomic<long> value{0};
  } turn;  // even: this thread's move, odd: the other's
  struct alignas(64) Flags {
    std::atomic<bool> stop{false};
    std::atomic<int> pinned{0};  // 0: not yet, 1: pinned, -1: could not pin
  } flags;
  std::thread other([&] {
    flags.pinned.store(Pin(cpu_b) ? 1 : -1);
    for (long expected = 1;; expected += 2) {
      while (turn.value.load(std::memory_order_acquire) != expected) {
        if (flags.stop.load(std::memory_order_relaxed)) return;
      }
      turn.value.store(expected + 1, std::memory_order_release);
    }
  });
  while (flags.pinned.load() == 0) std::this_thread::yield();
  std::vector<double> batches;
  if (flags.pinned.load() == 1) {
    const auto start = std::chrono::steady_clock::now();
    long value = 0;
    bool slow = false;
    bool first = true;  // not kept: the other thread may still be moving to cpu_b
    do {
      const auto begin = std::chrono::steady_clock::now();
      for (long i = 0; i < kBatch; ++i) {
        turn.value.store(value + 1, std::memory_order_release);
        while (turn.value.load(std::memory_order_acquire) != value + 2) {
        }
        value += 2;
      }
      const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - begin).count();
      slow = !first && ns > 1e5 * kBatch;
      if (!first) batches.push_back(ns / kBatch);
      first = false;
    } while (!slow && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds);
    if (slow) batches.clear();
  }
  flags.stop.store(true);
  other.join();
  pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
  if (batches.empty()) return -1.0;
  std::nth_element(batches.begin(), batches.begin() + batches.size() / 2, batches.end());
  return batches[batches.size() / 2];
#else
  (void)cpu_a;
  (void)cpu_b;
  (void)seconds;
  return -1.0;
#endif
}
