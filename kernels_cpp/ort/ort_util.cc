// C API plumbing for the adapters. Every OrtStatus returned by ORT is released here; callers get
// plain messages.
#include "ort/ort_util.h"

#include <algorithm>
#include <cctype>
#include <thread>
#include <memory>
#include <new>
#include <sstream>

#include "generated/op_schema.h"

namespace ortlstm::ort {
namespace {

const OrtApi* g_api = nullptr;
const OrtApi* g_api_string_arrays = nullptr;
int g_release_minor = -1;

// Takes ownership of `status`; returns its message, or "" for success.
std::string Consume(OrtStatus* status) {
  if (status == nullptr) return "";
  std::string message = Api().GetErrorMessage(status);
  Api().ReleaseStatus(status);
  return message.empty() ? "unknown onnxruntime error" : message;
}

std::optional<int64_t> ReadInt(const OrtKernelInfo* info, const char* name) {
  int64_t value = 0;
  if (!Consume(Api().KernelInfoGetAttribute_int64(info, name, &value)).empty()) return std::nullopt;
  return value;
}

std::optional<float> ReadFloat(const OrtKernelInfo* info, const char* name) {
  float value = 0.0f;
  if (!Consume(Api().KernelInfoGetAttribute_float(info, name, &value)).empty()) return std::nullopt;
  return value;
}

std::optional<std::string> ReadString(const OrtKernelInfo* info, const char* name) {
  size_t size = 0;
  if (!Consume(Api().KernelInfoGetAttribute_string(info, name, nullptr, &size)).empty() || size == 0) {
    return std::nullopt;
  }
  std::string value(size, '\0');
  if (!Consume(Api().KernelInfoGetAttribute_string(info, name, value.data(), &size)).empty()) return std::nullopt;
  value.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  return value;
}

std::optional<std::vector<float>> ReadFloats(const OrtKernelInfo* info, const char* name) {
  size_t size = 0;
  if (!Consume(Api().KernelInfoGetAttributeArray_float(info, name, nullptr, &size)).empty()) return std::nullopt;
  std::vector<float> values(size);
  if (size > 0 && !Consume(Api().KernelInfoGetAttributeArray_float(info, name, values.data(), &size)).empty()) {
    return std::nullopt;
  }
  return values;
}

std::optional<std::vector<std::string>> ReadStrings(const OrtKernelInfo* info, const char* name) {
#if ORT_API_VERSION >= 25
  if (g_api_string_arrays == nullptr) return std::nullopt;
  OrtAllocator* allocator = nullptr;
  if (!Consume(Api().GetAllocatorWithDefaultOptions(&allocator)).empty()) return std::nullopt;
  char** strings = nullptr;
  size_t size = 0;
  if (!Consume(g_api_string_arrays->KernelInfoGetAttributeArray_string(info, name, allocator, &strings, &size))
           .empty()) {
    return std::nullopt;
  }
  std::vector<std::string> values;
  for (size_t i = 0; i < size; ++i) {
    values.emplace_back(strings[i]);
    allocator->Free(allocator, strings[i]);
  }
  if (strings != nullptr) allocator->Free(allocator, strings);
  return values;
#else
  (void)info;
  (void)name;
  return std::nullopt;
#endif
}

// What the C API can tell of attribute `name`. It has no presence or type query (version 19), so
// this asks each getter in turn: "missing" shows in ORT's message, the scalar getters fail on an
// attribute of another type, but the list getters return an empty list for one, so a list is seen
// only when it is not empty (string lists only where they can be read at all, onnxruntime >= 1.25).
struct AttributeProbe {
  bool present = false;
  std::optional<schema::attr::Type> type;  // present but nullopt: an empty list, or a type none reads
};

AttributeProbe ProbeAttribute(const OrtKernelInfo* info, const char* name) {
  using Type = schema::attr::Type;
  int64_t int_value = 0;
  const std::string error = Consume(Api().KernelInfoGetAttribute_int64(info, name, &int_value));
  if (error.empty()) return {true, Type::kInt};
  if (error.find("No attribute") != std::string::npos) return {false, std::nullopt};
  float float_value = 0.0f;
  if (Consume(Api().KernelInfoGetAttribute_float(info, name, &float_value)).empty()) return {true, Type::kFloat};
  size_t size = 0;
  if (Consume(Api().KernelInfoGetAttribute_string(info, name, nullptr, &size)).empty()) return {true, Type::kString};
  size = 0;
  if (Consume(Api().KernelInfoGetAttributeArray_int64(info, name, nullptr, &size)).empty() && size > 0) {
    return {true, Type::kInts};
  }
  size = 0;
  if (Consume(Api().KernelInfoGetAttributeArray_float(info, name, nullptr, &size)).empty() && size > 0) {
    return {true, Type::kFloats};
  }
  if (const auto strings = ReadStrings(info, name); strings && !strings->empty()) return {true, Type::kStrings};
  return {true, std::nullopt};
}

bool IsList(schema::attr::Type type) {
  using Type = schema::attr::Type;
  return type == Type::kInts || type == Type::kFloats || type == Type::kStrings;
}

// "" when every attribute the node sets has its declared type (ops/schema.py), else a message
// naming the first that does not. Without this a getter of the declared type would fail on it and
// the attribute would read as absent: `direction` given as an INT ran as forward.
std::string CheckAttributeTypes(const OrtKernelInfo* info) {
  for (const schema::attr::Spec& spec : schema::attr::kAll) {
    const AttributeProbe probe = ProbeAttribute(info, spec.name);
    if (!probe.present || probe.type == spec.type) continue;
    std::string got;
    if (probe.type) {
      got = schema::attr::TypeName(*probe.type);
    } else if (IsList(spec.type)) {
      continue;  // an empty list of any type reads as an empty list of the declared one
    } else {
      got = std::string("another type (not INT, FLOAT, STRING or a non-empty INTS, FLOATS") +
            (CanReadStringArrays() ? " or STRINGS)" : ")");
    }
    return std::string("attribute ") + spec.name + ": expected " + schema::attr::TypeName(spec.type) + ", got " + got;
  }
  return "";
}

std::vector<std::string> SplitCommaList(const std::string& text) {
  std::vector<std::string> items;
  std::string item;
  std::istringstream stream(text);
  while (std::getline(stream, item, ',')) {
    const auto first = item.find_first_not_of(" \t");
    const auto last = item.find_last_not_of(" \t");
    items.push_back(first == std::string::npos ? "" : item.substr(first, last - first + 1));
  }
  if (!text.empty() && text.back() == ',') items.emplace_back();  // getline drops a trailing empty item
  return items;
}

std::string Lower(std::string text) {
  for (char& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return text;
}

}  // namespace

const OrtApi& Api() { return *g_api; }

void SetRuntime(const OrtApi* api, const OrtApi* api_with_string_arrays, int release_minor) {
  g_api = api;
  g_api_string_arrays = api_with_string_arrays;
  g_release_minor = release_minor;
}

bool RuntimeIsAtLeast(int release_minor) { return g_release_minor >= release_minor; }

bool CanReadStringArrays() { return g_api_string_arrays != nullptr; }

OrtStatus* MakeStatus(OrtErrorCode code, const std::string& message) { return Api().CreateStatus(code, message.c_str()); }

std::string ReadInput(OrtKernelContext* context, size_t index, TensorArg* arg) {
  *arg = TensorArg{};
  size_t count = 0;
  std::string error = Consume(Api().KernelContext_GetInputCount(context, &count));
  if (!error.empty() || index >= count) return error;
  const OrtValue* value = nullptr;
  error = Consume(Api().KernelContext_GetInput(context, index, &value));
  if (!error.empty() || value == nullptr) return error;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  error = Consume(Api().GetTensorTypeAndShape(value, &info));
  if (!error.empty()) return error;
  std::unique_ptr<OrtTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo*)> owned(
      info, [](OrtTensorTypeAndShapeInfo* p) { Api().ReleaseTensorTypeAndShapeInfo(p); });
  size_t rank = 0;
  error = Consume(Api().GetTensorElementType(info, &arg->type));
  if (error.empty()) error = Consume(Api().GetDimensionsCount(info, &rank));
  if (!error.empty()) return error;
  arg->shape.resize(rank);
  if (rank > 0) error = Consume(Api().GetDimensions(info, arg->shape.data(), rank));
  if (!error.empty()) return error;
  void* data = nullptr;
  error = Consume(Api().GetTensorMutableData(const_cast<OrtValue*>(value), &data));
  if (!error.empty()) return error;
  arg->data = data;
  arg->present = true;
  return "";
}

std::string AllocateOutput(OrtKernelContext* context, size_t index, const std::vector<int64_t>& shape, void** data) {
  *data = nullptr;
  size_t count = 0;
  std::string error = Consume(Api().KernelContext_GetOutputCount(context, &count));
  if (!error.empty() || index >= count) return error;
  OrtValue* value = nullptr;
  error = Consume(Api().KernelContext_GetOutput(context, index, shape.data(), shape.size(), &value));
  if (!error.empty() || value == nullptr) return error;
  return Consume(Api().GetTensorMutableData(value, data));
}

OrtExecutor::OrtExecutor(OrtKernelContext* context) : context_(context) {
  // ORT's C API does not tell the pool size; the machine's hardware threads bound it (ORT's
  // default intra-op pool has one thread per physical core). A pool with fewer threads just runs
  // the extra tasks in turn; task boundaries, hence results, depend only on this width.
  // Read once: glibc answers hardware_concurrency() by reading /sys/devices/system/cpu/online,
  // which took about 10 us of every kernel call.
  static const int width = [] {
    const unsigned hardware = std::thread::hardware_concurrency();
    return hardware == 0 ? 1 : static_cast<int>(std::min(hardware, 64u));
  }();
  width_ = width;
}

void OrtExecutor::For(std::size_t count, const std::function<void(std::size_t)>& task) const {
  if (count == 0) return;
  if (count == 1) {
    task(0);
    return;
  }
  auto trampoline = [](void* data, size_t index) { (*static_cast<const std::function<void(std::size_t)>*>(data))(index); };
  OrtStatus* status = Api().KernelContext_ParallelFor(context_, trampoline, count, 0,
                                                      const_cast<std::function<void(std::size_t)>*>(&task));
  if (status != nullptr) {
    // Only a null context fails; run the tasks here rather than lose them.
    Api().ReleaseStatus(status);
    for (std::size_t i = 0; i < count; ++i) task(i);
  }
}

OrtScratchAllocator::OrtScratchAllocator(OrtKernelContext* context) {
  OrtMemoryInfo* info = nullptr;
  OrtStatus* status = Api().CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &info);
  if (status == nullptr) status = Api().KernelContext_GetAllocator(context, info, &allocator_);
  if (status != nullptr) {
    Api().ReleaseStatus(status);
    allocator_ = nullptr;
  }
  if (info != nullptr) Api().ReleaseMemoryInfo(info);
}

OrtScratchAllocator::~OrtScratchAllocator() {
  if (allocator_ != nullptr) Api().ReleaseAllocator(allocator_);
}

void* OrtScratchAllocator::Allocate(std::size_t bytes) const {
  if (allocator_ == nullptr) return heap_.Allocate(bytes);
  void* p = nullptr;
  if (OrtStatus* status = Api().AllocatorAlloc(allocator_, bytes, &p)) {
    Api().ReleaseStatus(status);
    throw std::bad_alloc();
  }
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void OrtScratchAllocator::Free(void* p) const noexcept {
  if (allocator_ == nullptr) {
    heap_.Free(p);
    return;
  }
  if (OrtStatus* status = Api().AllocatorFree(allocator_, p)) Api().ReleaseStatus(status);
}

std::string AddOps(OrtCustomOpDomain* domain, std::initializer_list<OrtCustomOp*> ops) {
  for (OrtCustomOp* op : ops) {
    if (std::string error = Consume(Api().CustomOpDomain_Add(domain, op)); !error.empty()) return error;
  }
  return "";
}

std::string FormatShape(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::string ReadIntAttribute(const OrtKernelInfo* info, const char* name, int64_t default_value, int64_t* value) {
  const AttributeProbe probe = ProbeAttribute(info, name);
  *value = default_value;
  if (!probe.present) return "";
  if (probe.type != schema::attr::Type::kInt) {
    const std::string got = probe.type ? schema::attr::TypeName(*probe.type) : "another type";
    return std::string("attribute ") + name + ": expected INT, got " + got;
  }
  *value = ReadInt(info, name).value_or(default_value);
  return "";
}

std::string ReadIntsAttribute(const OrtKernelInfo* info, const char* name,
                              std::optional<std::vector<int64_t>>* values) {
  const AttributeProbe probe = ProbeAttribute(info, name);
  values->reset();
  if (!probe.present) return "";
  if (!probe.type) {  // an empty list
    *values = std::vector<int64_t>{};
    return "";
  }
  if (probe.type != schema::attr::Type::kInts) {
    return std::string("attribute ") + name + ": expected INTS, got " + schema::attr::TypeName(*probe.type);
  }
  size_t size = 0;
  std::string error = Consume(Api().KernelInfoGetAttributeArray_int64(info, name, nullptr, &size));
  std::vector<int64_t> read(size);
  if (error.empty() && size > 0) {
    error = Consume(Api().KernelInfoGetAttributeArray_int64(info, name, read.data(), &size));
  }
  if (!error.empty()) return std::string("attribute ") + name + ": " + error;
  *values = std::move(read);
  return "";
}

std::string ReadStringAttribute(const OrtKernelInfo* info, const char* name, const char* default_value,
                                std::string* value) {
  const AttributeProbe probe = ProbeAttribute(info, name);
  *value = default_value;
  if (!probe.present) return "";
  if (probe.type != schema::attr::Type::kString) {
    const std::string got = probe.type ? schema::attr::TypeName(*probe.type) : "another type";
    return std::string("attribute ") + name + ": expected STRING, got " + got;
  }
  *value = ReadString(info, name).value_or(default_value);
  return "";
}

OrtStatus* Fail(const char* op_name, const std::string& node, const std::string& message) {
  std::string text = std::string(op_name);
  if (!node.empty()) text += " node '" + node + "'";
  return MakeStatus(ORT_INVALID_ARGUMENT, text + ": " + message);
}

OrtStatus* OutOfMemory(const char* op_name, const std::string& node) {
  std::string text = std::string(op_name);
  if (!node.empty()) text += " node '" + node + "'";
  return MakeStatus(ORT_FAIL, text + ": out of memory for the scratch buffers");
}

std::string NodeName(const OrtKernelInfo* info) {
  size_t size = 0;
  if (!Consume(Api().KernelInfo_GetNodeName(info, nullptr, &size)).empty() || size <= 1) return "";
  std::string name(size, '\0');
  if (!Consume(Api().KernelInfo_GetNodeName(info, name.data(), &size)).empty()) return "";
  name.resize(size > 0 ? size - 1 : 0);
  return name;
}

std::string ReadLstmAttributes(const OrtKernelInfo* info, RawLstmAttributes* raw) {
  namespace attr = schema::attr;
  if (std::string error = CheckAttributeTypes(info); !error.empty()) return error;
  raw->hidden_size = ReadInt(info, attr::kHiddenSize);
  raw->direction = ReadString(info, attr::kDirection);
  raw->activation_alpha = ReadFloats(info, attr::kActivationAlpha);
  raw->activation_beta = ReadFloats(info, attr::kActivationBeta);
  raw->clip = ReadFloat(info, attr::kClip);
  raw->input_forget = ReadInt(info, attr::kInputForget);
  raw->layout = ReadInt(info, attr::kLayout);
  raw->matmul_precision = ReadString(info, attr::kMatmulPrecision);

  const std::optional<std::vector<std::string>> listed = ReadStrings(info, attr::kActivations);
  const std::optional<std::string> joined = ReadString(info, attr::kActivationsCsv);
  std::optional<std::vector<std::string>> from_joined;
  if (joined) from_joined = SplitCommaList(*joined);
  if (listed && from_joined) {
    std::vector<std::string> a = *listed;
    std::vector<std::string> b = *from_joined;
    for (auto& s : a) s = Lower(s);
    for (auto& s : b) s = Lower(s);
    if (a != b) {
      return std::string("attributes ") + attr::kActivations + " and " + attr::kActivationsCsv +
             " disagree: activations has " + std::to_string(listed->size()) + " names, activations_csv is '" +
             *joined + "'";
    }
  }
  raw->activations = listed ? listed : from_joined;
  if (!listed && from_joined) raw->activations_attribute = attr::kActivationsCsv;
  if (!raw->activations && !CanReadStringArrays() && ProbeAttribute(info, attr::kActivations).present) {
    return std::string("attribute activations cannot be read by custom-op kernels on onnxruntime older than 1.25 ") +
           "(its C API has no string-list attribute reader), and ignoring it would compute with the wrong "
           "activations. Also give the same names as the string attribute activations_csv, e.g. "
           "activations_csv=\"Sigmoid,Tanh,Tanh\" (ortlstm.ops.make_node and ortlstm.graphs do this), or use "
           "onnxruntime >= 1.25.";
  }
  return "";
}

}  // namespace ortlstm::ort
