// How long a cache line takes to go from one core to another and back: two threads pinned to CPUs
// A and B hand a counter back and forth; prints the mean round trip in ns for each batch of 200000,
// one number per batch, for `seconds`. On a VM the figure moves when the host moves the vCPUs
// (docs/performance.md: 56 against about 320 ns on the 2-vCPU AMD Zen 4), and the kernels' small
// sizes, which hand off every time step, move with it: run it beside a benchmark to tell the states
// apart. Linux only.
//
//   g++ -O2 -std=c++17 -pthread scripts/core_round_trip.cc -o /tmp/core_round_trip
//   /tmp/core_round_trip [seconds=10] [cpu_a=0] [cpu_b=1]
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {

bool Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 10.0;
  const int cpu_a = argc > 2 ? std::atoi(argv[2]) : 0;
  const int cpu_b = argc > 3 ? std::atoi(argv[3]) : 1;
  constexpr long kBatch = 200000;
  alignas(64) static std::atomic<long> turn{0};  // even: thread A's move, odd: B's
  std::atomic<bool> stop{false};
  std::thread other([&] {
    if (!Pin(cpu_b)) std::fprintf(stderr, "cannot pin to CPU %d\n", cpu_b);
    for (long expected = 1;; expected += 2) {
      while (turn.load(std::memory_order_acquire) != expected) {
        if (stop.load(std::memory_order_relaxed)) return;
      }
      turn.store(expected + 1, std::memory_order_release);
    }
  });
  if (!Pin(cpu_a)) std::fprintf(stderr, "cannot pin to CPU %d\n", cpu_a);
  const auto start = std::chrono::steady_clock::now();
  long value = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    const auto begin = std::chrono::steady_clock::now();
    for (long i = 0; i < kBatch; ++i) {
      turn.store(value + 1, std::memory_order_release);
      while (turn.load(std::memory_order_acquire) != value + 2) {
      }
      value += 2;
    }
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - begin).count();
    std::printf("%.0f ", ns / kBatch);
    std::fflush(stdout);
  }
  std::printf("\n");
  stop.store(true);
  other.join();
  return 0;
}
