// The "onednn" backend of the bf16 GEMM layer (common/bf16_gemm.h): oneDNN's matmul primitive with
// bfloat16 src/weights and float32 dst, which runs on AVX512-BF16 and AMX on any vendor's CPU (oneMKL's
// bf16 GEMM does not use AMD Zen 4's bf16 units; oneDNN does: what torch's autocast runs).
//
// libdnnl.so.3 (oneDNN 3.2, OpenMP runtime, from the onednn-cpu-gomp wheel) is NOT linked: it is
// dlopen'ed the first time a bf16 GEMM needs it, so float32 users pay nothing, and a missing or
// broken library is a reason string (the layer then falls back with a warning), never a crash. Only
// the C API's types come from the headers (onednn-devel-cpu-gomp, a build requirement); every
// function is looked up with dlsym. Nothing of oneDNN is copied into ortlstm or its wheels.
//
// Every call runs in the calling thread alone: the op's parallelism is ONNX Runtime's executor
// tasks, never a pool of ours, so each call sets the calling thread's OpenMP thread count to 1 for
// its duration (oneDNN's OpenMP runtime then runs its loops inline, spawning no team).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

namespace ortlstm {
namespace onednn {

// Loads libdnnl once per process; "" when it is usable, else why not (the path tried and dlerror,
// or a missing symbol). Where it looks: $ORTLSTM_ONEDNN_LIBRARY if set (that path only), else the
// onednn-cpu-gomp wheel's file <prefix>/lib/libdnnl.so.3 next to this library's site-packages,
// else "libdnnl.so.3" through the dynamic loader's search path.
const std::string& LoadError();

// "oneDNN 3.2.0 (<path>)" once loaded, else "".
std::string Description();

// C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C, bfloat16 operands (bits), row-major with
// leading dimensions in elements; beta == 0 ignores C's values. False (C untouched) when oneDNN
// cannot run it (not loaded, a primitive it refuses): the caller then takes the fallback.
bool Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
          const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc);

// A right operand op(B) [K, N] in bfloat16, reordered once into the layout oneDNN's matmul picks for
// it ("any" weights format, for M rows), with the primitives for each (rows, alpha, beta) created
// once and cached. Multiply is const and thread-safe.
class PackedB {
 public:
  // `b` bfloat16 bits of op(B) as given (trans_b, leading dimension ldb). ok() is false if oneDNN
  // refused the shape; the caller then keeps its own plain copy.
  PackedB(bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* b, int64_t ldb);
  PackedB(const PackedB&) = delete;
  PackedB& operator=(const PackedB&) = delete;
  ~PackedB();
  bool ok() const { return weights_ != nullptr; }

  // C[m, N] = alpha * A[m, K] * op(B) + beta * C, A dense bfloat16 (lda >= K), m <= the
  // constructor's. False (C untouched) if oneDNN refused this m with the packed layout.
  bool Multiply(const uint16_t* a, int64_t lda, int64_t m, float alpha, float beta, float* c, int64_t ldc) const;

  struct Primitive;  // a matmul primitive and its descriptors (bf16_onednn.cc)

 private:
  int64_t m_ = 0;
  int64_t n_ = 0;
  int64_t k_ = 0;
  void* weights_md_ = nullptr;  // dnnl_memory_desc_t of the packed layout
  std::unique_ptr<char[]> storage_;
  void* weights_ = nullptr;  // into storage_, 64-byte aligned
  mutable std::mutex mutex_;
  // By (rows, alpha, beta, lda, ldc); null where oneDNN refused the packed layout for those rows.
  mutable std::map<std::tuple<int64_t, uint32_t, uint32_t, int64_t, int64_t>, std::shared_ptr<Primitive>> cache_;
};

}  // namespace onednn
}  // namespace ortlstm
