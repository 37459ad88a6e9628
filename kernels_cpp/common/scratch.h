// Where the kernels take the scratch memory of a call from. The ORT adapter supplies an allocator
// backed by the session's CPU allocator (an arena by default, so the pages of one call's scratch
// are reused by the next instead of being mapped and faulted in again); HeapAllocator is the C++
// heap. Scratch<T> owns one array from either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace ortlstm {

class ScratchAllocator {
 public:
  virtual ~ScratchAllocator() = default;
  // At least `bytes` bytes, aligned to 64; throws std::bad_alloc when memory runs out.
  virtual void* Allocate(std::size_t bytes) const = 0;
  virtual void Free(void* p) const noexcept = 0;
};

class HeapAllocator final : public ScratchAllocator {
 public:
  void* Allocate(std::size_t bytes) const override { return ::operator new(bytes, std::align_val_t{64}); }
  void Free(void* p) const noexcept override { ::operator delete(p, std::align_val_t{64}); }
};

// An uninitialized array of `count` T from `allocator`, freed on destruction.
template <typename T>
class Scratch {
 public:
  Scratch() = default;
  Scratch(const ScratchAllocator& allocator, int64_t count)
      : allocator_(&allocator),
        data_(count > 0 ? static_cast<T*>(allocator.Allocate(static_cast<std::size_t>(count) * sizeof(T))) : nullptr) {}
  Scratch(Scratch&& other) noexcept
      : allocator_(other.allocator_), data_(std::exchange(other.data_, nullptr)) {}
  Scratch& operator=(Scratch&& other) noexcept {
    if (this != &other) {
      Release();
      allocator_ = other.allocator_;
      data_ = std::exchange(other.data_, nullptr);
    }
    return *this;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { Release(); }

  T* get() const { return data_; }

 private:
  void Release() noexcept {
    if (data_ != nullptr) allocator_->Free(data_);
    data_ = nullptr;
  }
  const ScratchAllocator* allocator_ = nullptr;
  T* data_ = nullptr;
};

}  // namespace ortlstm
