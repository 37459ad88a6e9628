// Thin helpers over ORT's C API for the adapters: read a kernel's inputs, allocate its outputs,
// read node attributes and turn messages into OrtStatus. Only C API functions of version <= 19
// are called through Api(); newer ones go through ApiAtLeast(), which is null on older runtimes.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/parallel.h"
#include "common/scratch.h"
#include "lstm/lstm_config.h"

namespace ortlstm::ort {

// The C API version the library requests: the highest onnxruntime 1.19 provides.
inline constexpr uint32_t kOrtApiVersion = 19;
// onnxruntime 1.25 added KernelInfoGetAttributeArray_string (C API version = minor release).
inline constexpr int kOrtApiVersionStringArrays = 25;
// Releases before this one crash in custom-op shape inference when an optional input in the
// middle is omitted; 1.25 is the oldest release past the fix that the project has tested.
inline constexpr int kOrtApiVersionFixedShapeInference = 25;

const OrtApi& Api();
// Set once by RegisterCustomOps: the API used for everything, the one with string-list
// attribute readers (null on older runtimes) and the runtime's minor release number.
void SetRuntime(const OrtApi* api, const OrtApi* api_with_string_arrays, int release_minor);
bool RuntimeIsAtLeast(int release_minor);
// Whether kernels can read string-list attributes (activations) directly.
bool CanReadStringArrays();

OrtStatus* MakeStatus(OrtErrorCode code, const std::string& message);

// ORT's element type of a kernel's float type T (float or double).
template <typename T>
constexpr ONNXTensorElementDataType kElementType = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
template <>
constexpr ONNXTensorElementDataType kElementType<float> = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
template <>
constexpr ONNXTensorElementDataType kElementType<double> = ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;

// One kernel input as the adapter sees it; `present` is false for an omitted optional input.
struct TensorArg {
  bool present = false;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> shape;
  const void* data = nullptr;

  template <typename T>
  const T* Data() const {
    return present ? static_cast<const T*>(data) : nullptr;
  }
};

// Reads input `index` (absent when the node has fewer inputs or an empty name there).
std::string ReadInput(OrtKernelContext* context, size_t index, TensorArg* arg);
// Allocates output `index` with `shape` unless the node omitted it; *data stays null then.
std::string AllocateOutput(OrtKernelContext* context, size_t index, const std::vector<int64_t>& shape, void** data);

// Runs tasks on the session's intra-op thread pool (KernelContext_ParallelFor).
class OrtExecutor final : public Executor {
 public:
  explicit OrtExecutor(OrtKernelContext* context);
  void For(std::size_t count, const std::function<void(std::size_t)>& task) const override;
  int Width() const override { return width_; }

 private:
  OrtKernelContext* context_;
  int width_;
};

// Scratch memory from the session's CPU allocator (KernelContext_GetAllocator): an arena unless
// the session turned it off, so a call reuses the pages of the previous one. The C++ heap when
// ORT has no allocator to give.
class OrtScratchAllocator final : public ScratchAllocator {
 public:
  explicit OrtScratchAllocator(OrtKernelContext* context);
  ~OrtScratchAllocator() override;
  OrtScratchAllocator(const OrtScratchAllocator&) = delete;
  OrtScratchAllocator& operator=(const OrtScratchAllocator&) = delete;
  void* Allocate(std::size_t bytes) const override;
  void Free(void* p) const noexcept override;

 private:
  OrtAllocator* allocator_ = nullptr;
  HeapAllocator heap_;
};

// An INVALID_ARGUMENT status "<op> node '<node>': <message>" (no node part for an unnamed node).
OrtStatus* Fail(const char* op_name, const std::string& node, const std::string& message);

// matmul_precision="bfloat16" runs on float32 tensors only: the message refusing it on the
// float64 instantiation of an op (float64 is for gradient checks), or "" where T is float or the
// precision float32. Checked when the kernel is created (ConvGrad, the recurrent ops).
template <typename T>
std::string RefuseBf16Tensors(MatmulPrecision precision) {
  if (std::is_same_v<T, float> || precision != MatmulPrecision::kBfloat16) return "";
  return "attribute matmul_precision: bfloat16 takes float32 tensors, got float64 (float64 is for gradient checks); "
         "pass float32 tensors or matmul_precision=\"float32\"";
}
// A FAIL status saying that the op's scratch or outputs did not fit in memory.
OrtStatus* OutOfMemory(const char* op_name, const std::string& node);

// Reads every input of a node into `inputs`; "" or a message naming the input.
template <size_t N>
std::string ReadInputs(OrtKernelContext* context, std::array<TensorArg, N>* inputs, const bool (&optional)[N],
                       const char* const (&names)[N]) {
  for (size_t i = 0; i < N; ++i) {
    std::string error = ReadInput(context, i, &(*inputs)[i]);
    if (!error.empty()) return std::string(names[i]) + ": " + error;
    if (!optional[i] && !(*inputs)[i].present) return std::string("input ") + names[i] + " is required but missing";
  }
  return "";
}

// Appends op definitions (static objects, which ORT keeps pointers to) to `domain`; "" or ORT's message.
std::string AddOps(OrtCustomOpDomain* domain, std::initializer_list<OrtCustomOp*> ops);

// "[2, 3, 4]"
std::string FormatShape(const std::vector<int64_t>& shape);

// Reads the LSTM attributes of a node; "" on success or a message naming the attribute.
std::string ReadLstmAttributes(const OrtKernelInfo* info, RawLstmAttributes* raw);
std::string NodeName(const OrtKernelInfo* info);
// Reads INT attribute `name` into *value (`default_value` when the node omits it); "" or a message
// naming the attribute when the node gives it another type.
std::string ReadIntAttribute(const OrtKernelInfo* info, const char* name, int64_t default_value, int64_t* value);
// Reads INTS attribute `name` into *values (nullopt when the node omits it; an empty list reads as
// empty); "" or a message naming the attribute when the node gives it another type.
std::string ReadIntsAttribute(const OrtKernelInfo* info, const char* name, std::optional<std::vector<int64_t>>* values);
// Reads STRING attribute `name` into *value (`default_value` when the node omits it); "" or a
// message naming the attribute when the node gives it another type.
std::string ReadStringAttribute(const OrtKernelInfo* info, const char* name, const char* default_value,
                                std::string* value);

}  // namespace ortlstm::ort
