// The onednn backend of the bf16 GEMM layer (common/bf16_onednn.h): libdnnl loaded with dlopen, its C
// API called through dlsym'ed pointers, matmul primitives cached per shape.
#include "common/bf16_onednn.h"

// Built only with oneDNN's headers (cmake/Onednn.cmake: x86-64 with onednn-devel-cpu-gomp); elsewhere
// (aarch64, ORTLSTM_ONEDNN=OFF) this file is empty and bf16_gemm.cc never calls it.
#if defined(ORTLSTM_ONEDNN)

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "oneapi/dnnl/dnnl.h"

namespace ortlstm {
namespace onednn {
namespace {

// libdnnl is dlopen'ed from the onednn-cpu-gomp wheel's path, never linked and never bundled: a
// wheel repair (auditwheel) must not copy it into ortlstm's wheel (it is not a DT_NEEDED of
// libortlstm_ops.so, so auditwheel does not see it; keep it that way).
constexpr const char* kLibraryVariable = "ORTLSTM_ONEDNN_LIBRARY";
constexpr const char* kSoname = "libdnnl.so.3";

// The C API functions used, as pointers of their declared types (decltype of a declaration makes no
// reference to the symbol, so nothing is linked).
struct Api {
#define ORTLSTM_DNNL_FUNCTIONS(X)                                                                              \
  X(dnnl_engine_create) X(dnnl_stream_create) X(dnnl_stream_destroy) X(dnnl_stream_wait)                        \
  X(dnnl_memory_desc_create_with_strides) X(dnnl_memory_desc_create_with_tag) X(dnnl_memory_desc_clone)        \
  X(dnnl_memory_desc_destroy) X(dnnl_memory_desc_get_size) X(dnnl_memory_create) X(dnnl_memory_destroy)         \
  X(dnnl_memory_set_data_handle)                                                                               \
  X(dnnl_primitive_attr_create) X(dnnl_primitive_attr_destroy) X(dnnl_primitive_attr_set_scratchpad_mode)       \
  X(dnnl_primitive_attr_set_post_ops) X(dnnl_post_ops_create) X(dnnl_post_ops_destroy)                          \
  X(dnnl_post_ops_append_sum) X(dnnl_post_ops_append_eltwise) X(dnnl_matmul_primitive_desc_create)              \
  X(dnnl_reorder_primitive_desc_create) X(dnnl_primitive_desc_query_md) X(dnnl_primitive_desc_query) X(dnnl_primitive_desc_destroy)         \
  X(dnnl_primitive_create) X(dnnl_primitive_destroy) X(dnnl_primitive_execute) X(dnnl_version)
#define ORTLSTM_DNNL_MEMBER(name) decltype(&::name) name = nullptr;
  ORTLSTM_DNNL_FUNCTIONS(ORTLSTM_DNNL_MEMBER)
#undef ORTLSTM_DNNL_MEMBER
  // libgomp's, found through libdnnl's dependencies: the calling thread's OpenMP thread count.
  int (*omp_get_max_threads)() = nullptr;
  void (*omp_set_num_threads)(int) = nullptr;
  dnnl_engine_t engine = nullptr;
  std::string path;
};

Api g_api;
std::string g_load_error;

// Where this library lies, for the wheel's path of libdnnl (site-packages/ortlstm/ops -> <prefix>/lib).
std::string OwnDirectory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&OwnDirectory), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string file(info.dli_fname);
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? "" : file.substr(0, slash);
}

// The calling thread's OpenMP thread count is 1 while it lives: oneDNN (OpenMP runtime) then runs
// its parallel loops inline in this thread and starts no OpenMP team.
class OneThread {
 public:
  OneThread() : saved_(g_api.omp_get_max_threads()) {
    if (saved_ != 1) g_api.omp_set_num_threads(1);
  }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;
  ~OneThread() {
    if (saved_ != 1) g_api.omp_set_num_threads(saved_);
  }

 private:
  int saved_;
};

std::string LoadOnce() {
  std::vector<std::string> candidates;
  const char* forced = std::getenv(kLibraryVariable);
  if (forced != nullptr && forced[0] != '\0') {
    candidates.emplace_back(forced);
  } else {
    // <prefix>/lib/pythonX.Y/site-packages/ortlstm/ops -> <prefix>/lib, where pip puts the wheel's data.
    const std::string own = OwnDirectory();
    if (!own.empty()) candidates.push_back(own + "/../../../../" + kSoname);
    candidates.emplace_back(kSoname);
  }
  std::string tried;
  void* handle = nullptr;
  for (const std::string& candidate : candidates) {
    handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      g_api.path = candidate;
      break;
    }
    const char* error = dlerror();
    tried += (tried.empty() ? "" : "; ") + std::string(error != nullptr ? error : candidate.c_str());
  }
  if (handle == nullptr) {
    return "cannot load oneDNN (" + tried + "); pip install onednn-cpu-gomp==2023.2.0, or set " + kLibraryVariable +
           " to its libdnnl.so.3";
  }
  // Never dlclosed: primitives and thread-local streams live until the process ends.
#define ORTLSTM_DNNL_RESOLVE(name)                                                                   \
  g_api.name = reinterpret_cast<decltype(g_api.name)>(dlsym(handle, #name));                         \
  if (g_api.name == nullptr) return g_api.path + " has no " #name " (oneDNN 3.x with OpenMP expected)";
  ORTLSTM_DNNL_FUNCTIONS(ORTLSTM_DNNL_RESOLVE)
  ORTLSTM_DNNL_RESOLVE(omp_get_max_threads)
  ORTLSTM_DNNL_RESOLVE(omp_set_num_threads)
#undef ORTLSTM_DNNL_RESOLVE
  if (g_api.dnnl_version()->major != 3) return g_api.path + " is not oneDNN 3.x";
  const OneThread one_thread;
  if (g_api.dnnl_engine_create(&g_api.engine, dnnl_cpu, 0) != dnnl_success) {
    return g_api.path + ": dnnl_engine_create failed";
  }
  return "";
}

// The memory objects of one primitive's execution in one thread (src, weights, dst, scratchpad), kept
// and re-pointed at each call's buffers (dnnl_memory_set_data_handle): creating and destroying them
// every call cost a few microseconds each, ~256 times per op call at M (the per-step GEMMs; issue 33).
struct Bound {
  dnnl_memory_t memories[4] = {nullptr, nullptr, nullptr, nullptr};
  void Destroy() {
    for (dnnl_memory_t& memory : memories) {
      if (memory != nullptr) g_api.dnnl_memory_destroy(memory);
      memory = nullptr;
    }
  }
};
constexpr size_t kMaxBound = 256;  // primitives a thread keeps memory objects for, then it starts over

// One stream per thread (a stream is not to be shared by threads running at once); a scratchpad per thread.
struct ThreadState {
  dnnl_stream_t stream = nullptr;
  std::vector<char> scratch;
  std::map<uint64_t, Bound> bound;  // by Primitive::id
  void ClearBound() {
    for (auto& entry : bound) entry.second.Destroy();
    bound.clear();
  }
  ~ThreadState() {
    ClearBound();
    if (stream != nullptr) g_api.dnnl_stream_destroy(stream);
  }
};

ThreadState* State() {
  thread_local ThreadState state;
  if (state.stream == nullptr && g_api.dnnl_stream_create(&state.stream, g_api.engine, dnnl_stream_default_flags) !=
                                     dnnl_success) {
    state.stream = nullptr;
    return nullptr;
  }
  return &state;
}

// An owned memory descriptor.
struct Md {
  dnnl_memory_desc_t md = nullptr;
  Md() = default;
  Md(const Md&) = delete;
  Md& operator=(const Md&) = delete;
  ~Md() {
    if (md != nullptr) g_api.dnnl_memory_desc_destroy(md);
  }
};

bool Strided(Md* out, int64_t rows, int64_t cols, bool transposed, int64_t ld, dnnl_data_type_t type) {
  const dnnl_dims_t dims = {rows, cols};
  const dnnl_dims_t strides = {transposed ? 1 : ld, transposed ? ld : 1};
  return g_api.dnnl_memory_desc_create_with_strides(&out->md, 2, dims, type, strides) == dnnl_success;
}

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

uint64_t NextId() {
  static std::atomic<uint64_t> next{0};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

// A matmul primitive and the descriptors its execution needs (the weights' is the caller's for PackedB).
struct PackedB::Primitive {
  // Unique for the process (never reused, unlike an address): the key of a thread's memory objects.
  const uint64_t id = NextId();
  Md src;
  Md weights;
  Md dst;
  dnnl_primitive_t primitive = nullptr;
  size_t scratch_bytes = 0;
  ~Primitive() {
    if (primitive != nullptr) g_api.dnnl_primitive_destroy(primitive);
  }
};

namespace {

using Primitive = PackedB::Primitive;

constexpr int64_t kRefLimit = int64_t{1} << 21;  // multiply-adds from which "ref:any" is refused (MakeMatmul)

// dst = alpha * src * weights (+ beta * dst): eltwise linear for alpha, then the sum post-op for beta
// (post-ops apply in order, so sum adds beta * the old C to alpha * the product). Scratchpad in user
// mode: each thread passes its own, so one primitive runs in several threads at once.
std::shared_ptr<Primitive> MakeMatmul(std::shared_ptr<Primitive> made, const_dnnl_memory_desc_t weights, float alpha,
                                      float beta, int64_t multiply_adds) {
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t post_ops = nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  bool ok = g_api.dnnl_primitive_attr_create(&attr) == dnnl_success &&
            g_api.dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success &&
            g_api.dnnl_post_ops_create(&post_ops) == dnnl_success;
  if (ok && alpha != 1.0f) ok = g_api.dnnl_post_ops_append_eltwise(post_ops, dnnl_eltwise_linear, alpha, 0.0f) == 0;
  if (ok && beta != 0.0f) ok = g_api.dnnl_post_ops_append_sum(post_ops, beta, 0, dnnl_data_type_undef) == 0;
  ok = ok && g_api.dnnl_primitive_attr_set_post_ops(attr, post_ops) == dnnl_success;
  {
    const OneThread one_thread;  // implementations may size their blocking by the thread count
    ok = ok && g_api.dnnl_matmul_primitive_desc_create(&pd, g_api.engine, made->src.md, weights, nullptr,
                                                        made->dst.md, attr) == dnnl_success;
    // oneDNN's reference implementation ("ref:any") is what it falls back to when no optimized kernel
    // takes the layouts (e.g. packed weights with a strided C): ~1000x slower than its brgemm (an L
    // step, 64 x 1024 x 512, took 1.4 s), so from kRefLimit multiply-adds it counts as a refusal and
    // the caller takes the plain-layout path or the fallback GEMM; below, it is correct and fast enough.
    const char* implementation = nullptr;
    ok = ok && g_api.dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &implementation) == dnnl_success &&
         implementation != nullptr &&
         (multiply_adds < kRefLimit || std::strncmp(implementation, "ref", 3) != 0);
    ok = ok && g_api.dnnl_primitive_create(&made->primitive, pd) == dnnl_success;
  }
  if (ok) {
    made->scratch_bytes = g_api.dnnl_memory_desc_get_size(g_api.dnnl_primitive_desc_query_md(
        pd, dnnl_query_scratchpad_md, 0));
  }
  if (pd != nullptr) g_api.dnnl_primitive_desc_destroy(pd);
  if (post_ops != nullptr) g_api.dnnl_post_ops_destroy(post_ops);
  if (attr != nullptr) g_api.dnnl_primitive_attr_destroy(attr);
  return ok ? std::move(made) : nullptr;
}

// Runs `primitive` on the given buffers in this thread (the weights' descriptor: `weights_md`), with
// this thread's memory objects for it (created at its first run here, re-pointed after).
bool Execute(const Primitive& primitive, const_dnnl_memory_desc_t weights_md, const void* src, const void* weights,
             float* dst) {
  ThreadState* state = State();
  if (state == nullptr) return false;
  if (state->scratch.size() < primitive.scratch_bytes + 64) state->scratch.resize(primitive.scratch_bytes + 64);
  void* scratch = state->scratch.data() + (64 - reinterpret_cast<uintptr_t>(state->scratch.data()) % 64) % 64;
  void* handles[4] = {const_cast<void*>(src), const_cast<void*>(weights), dst, scratch};
  const int count = primitive.scratch_bytes > 0 ? 4 : 3;
  auto found = state->bound.find(primitive.id);
  bool ok = true;
  if (found == state->bound.end()) {
    if (state->bound.size() >= kMaxBound) state->ClearBound();
    Bound made;
    const_dnnl_memory_desc_t mds[4] = {primitive.src.md, weights_md, primitive.dst.md, nullptr};
    Md scratch_md;
    const dnnl_dims_t scratch_dims = {static_cast<dnnl_dim_t>(primitive.scratch_bytes)};
    ok = count == 3 || g_api.dnnl_memory_desc_create_with_tag(&scratch_md.md, 1, scratch_dims, dnnl_u8, dnnl_a) ==
                           dnnl_success;
    mds[3] = scratch_md.md;
    for (int i = 0; ok && i < count; ++i) {
      ok = g_api.dnnl_memory_create(&made.memories[i], mds[i], g_api.engine, handles[i]) == dnnl_success;
    }
    if (!ok) {
      made.Destroy();
      return false;
    }
    found = state->bound.emplace(primitive.id, made).first;
  } else {
    for (int i = 0; ok && i < count; ++i) {
      ok = g_api.dnnl_memory_set_data_handle(found->second.memories[i], handles[i]) == dnnl_success;
    }
  }
  const int arg_ids[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD};
  dnnl_exec_arg_t args[4];
  for (int i = 0; i < count; ++i) args[i] = {arg_ids[i], found->second.memories[i]};
  if (ok) {
    const OneThread one_thread;
    ok = g_api.dnnl_primitive_execute(primitive.primitive, state->stream, count, args) == dnnl_success &&
         g_api.dnnl_stream_wait(state->stream) == dnnl_success;
  }
  return ok;
}

// The plain GEMMs' primitives by everything that shapes them; cleared when it grows past kMaxCached
// (shared pointers keep a primitive that another thread runs alive). Never destroyed: at exit,
// libdnnl (loaded after this library) runs its static destructors before this library's would run,
// so destroying primitives then could call into a torn-down oneDNN.
using GemmKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t, uint32_t>;
constexpr size_t kMaxCached = 512;
struct GemmCache {
  std::mutex mutex;
  std::map<GemmKey, std::shared_ptr<Primitive>> primitives;
};
GemmCache& Cache() {
  static GemmCache* cache = new GemmCache;
  return *cache;
}

}  // namespace

const std::string& LoadError() {
  static std::once_flag once;
  std::call_once(once, [] { g_load_error = LoadOnce(); });
  return g_load_error;
}

std::string Description() {
  if (!LoadError().empty()) return "";
  const dnnl_version_t* version = g_api.dnnl_version();
  return "oneDNN " + std::to_string(version->major) + "." + std::to_string(version->minor) + "." +
         std::to_string(version->patch) + " (" + g_api.path + ")";
}

bool Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
          const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (!LoadError().empty()) return false;
  const OneThread one_thread;
  const GemmKey key{trans_a, trans_b, m, n, k, lda, ldb, ldc, Bits(alpha), Bits(beta)};
  std::shared_ptr<Primitive> primitive;
  GemmCache& cache = Cache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    const auto found = cache.primitives.find(key);
    if (found != cache.primitives.end()) primitive = found->second;
  }
  if (primitive == nullptr) {
    auto made = std::make_shared<Primitive>();
    if (!Strided(&made->src, m, k, trans_a, lda, dnnl_bf16) ||
        !Strided(&made->weights, k, n, trans_b, ldb, dnnl_bf16) || !Strided(&made->dst, m, n, false, ldc, dnnl_f32)) {
      return false;
    }
    const_dnnl_memory_desc_t weights = made->weights.md;
    primitive = MakeMatmul(std::move(made), weights, alpha, beta, m * n * k);
    if (primitive == nullptr) return false;
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (cache.primitives.size() >= kMaxCached) cache.primitives.clear();
    cache.primitives.emplace(key, primitive);
  }
  return Execute(*primitive, primitive->weights.md, a, b, c);
}

PackedB::PackedB(bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* b, int64_t ldb) : m_(m), n_(n), k_(k) {
  if (!LoadError().empty() || m <= 0 || n <= 0 || k <= 0) return;
  const OneThread one_thread;  // the reorder too, and whatever oneDNN runs while creating primitives
  // The layout the primitive for m rows wants ("any" weights), then B reordered into it once.
  auto probe = std::make_shared<Primitive>();
  Md plain;
  Md any;
  const dnnl_dims_t weight_dims = {k, n};
  if (!Strided(&probe->src, m, k, false, k, dnnl_bf16) || !Strided(&probe->dst, m, n, false, n, dnnl_f32) ||
      !Strided(&plain, k, n, trans_b, ldb, dnnl_bf16) ||
      g_api.dnnl_memory_desc_create_with_tag(&any.md, 2, weight_dims, dnnl_bf16, dnnl_format_tag_any) !=
          dnnl_success) {
    return;
  }
  dnnl_primitive_desc_t pd = nullptr;
  {
    const OneThread one_thread;
    if (g_api.dnnl_matmul_primitive_desc_create(&pd, g_api.engine, probe->src.md, any.md, nullptr, probe->dst.md,
                                                nullptr) != dnnl_success) {
      return;
    }
  }
  dnnl_memory_desc_t packed = nullptr;
  const bool cloned = g_api.dnnl_memory_desc_clone(&packed, g_api.dnnl_primitive_desc_query_md(
                                                                pd, dnnl_query_weights_md, 0)) == dnnl_success;
  g_api.dnnl_primitive_desc_destroy(pd);
  if (!cloned) return;
  weights_md_ = packed;
  const size_t bytes = g_api.dnnl_memory_desc_get_size(packed);
  storage_.reset(new (std::nothrow) char[bytes + 64]);
  if (storage_ == nullptr) return;
  void* target = storage_.get() + (64 - reinterpret_cast<uintptr_t>(storage_.get()) % 64) % 64;
  // The reorder: plain (strided) bfloat16 -> the packed layout, in this thread.
  dnnl_primitive_desc_t reorder_pd = nullptr;
  dnnl_primitive_t reorder = nullptr;
  dnnl_memory_t from = nullptr;
  dnnl_memory_t to = nullptr;
  ThreadState* state = State();
  bool ok = state != nullptr &&
            g_api.dnnl_reorder_primitive_desc_create(&reorder_pd, plain.md, g_api.engine, packed, g_api.engine,
                                                     nullptr) == dnnl_success &&
            g_api.dnnl_primitive_create(&reorder, reorder_pd) == dnnl_success &&
            g_api.dnnl_memory_create(&from, plain.md, g_api.engine, const_cast<uint16_t*>(b)) == dnnl_success &&
            g_api.dnnl_memory_create(&to, packed, g_api.engine, target) == dnnl_success;
  if (ok) {
    const OneThread one_thread;
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    ok = g_api.dnnl_primitive_execute(reorder, state->stream, 2, args) == dnnl_success &&
         g_api.dnnl_stream_wait(state->stream) == dnnl_success;
  }
  if (to != nullptr) g_api.dnnl_memory_destroy(to);
  if (from != nullptr) g_api.dnnl_memory_destroy(from);
  if (reorder != nullptr) g_api.dnnl_primitive_destroy(reorder);
  if (reorder_pd != nullptr) g_api.dnnl_primitive_desc_destroy(reorder_pd);
  if (ok) weights_ = target;
}

PackedB::~PackedB() {
  cache_.clear();
  if (weights_md_ != nullptr) g_api.dnnl_memory_desc_destroy(static_cast<dnnl_memory_desc_t>(weights_md_));
}

bool PackedB::Multiply(const uint16_t* a, int64_t lda, int64_t m, float alpha, float beta, float* c,
                       int64_t ldc) const {
  if (weights_ == nullptr || m > m_) return false;
  const OneThread one_thread;
  const auto key = std::make_tuple(m, Bits(alpha), Bits(beta), lda, ldc);
  std::shared_ptr<Primitive> primitive;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = cache_.find(key);
    if (found != cache_.end()) {
      if (found->second == nullptr) return false;
      primitive = found->second;
    }
  }
  const auto weights_md = static_cast<const_dnnl_memory_desc_t>(weights_md_);
  if (primitive == nullptr) {
    auto made = std::make_shared<Primitive>();
    if (!Strided(&made->src, m, k_, false, lda, dnnl_bf16) || !Strided(&made->dst, m, n_, false, ldc, dnnl_f32)) {
      return false;
    }
    primitive = MakeMatmul(std::move(made), weights_md, alpha, beta, m * n_ * k_);
    std::lock_guard<std::mutex> lock(mutex_);
    if (cache_.size() >= kMaxCached) cache_.clear();
    cache_.emplace(key, primitive);
    if (primitive == nullptr) return false;  // this m refuses the packed layout: the caller's plain copy
  }
  return Execute(*primitive, weights_md, a, weights_, c);
}

}  // namespace onednn
}  // namespace ortlstm

#endif  // ORTLSTM_ONEDNN
