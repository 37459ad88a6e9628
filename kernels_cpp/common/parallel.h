// The only threading site: work is split into tasks that an executor runs, possibly in
// parallel. The ORT adapter supplies an executor backed by the session's intra-op thread pool
// (KernelContext_ParallelFor); BLAS runs single-threaded inside tasks, so there is one owner of
// threads. Task boundaries are fixed by the caller, never by timing, so results do not depend
// on which thread ran what.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

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

}  // namespace ortlstm
