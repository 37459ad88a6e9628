// What the op definitions of the optimizer and CTC ops share: ORT's port queries answered from the
// op's generated schema (through Traits: kName, kNumInputs, kNumOutputs, kInputOptional,
// kOutputOptional), the struct version and the kernel's allocation. The derived op adds CreateKernelV2 and GetInputType.
#pragma once

#include <new>
#include <string>
#include <utility>

#include "ort/ort_util.h"

namespace ortlstm::ort {

template <typename Derived, typename Kernel, typename Traits, typename T>
struct SchemaOp : Ort::CustomOpBase<Derived, Kernel, /*WithStatus=*/true> {
  SchemaOp() {
    // ORT 1.19 rejects ops that declare a newer struct version than it knows.
    OrtCustomOp::version = kOrtApiVersion;
  }

  // Stores a new Kernel(args...) in *kernel, or returns the out-of-memory status.
  template <typename... Args>
  static OrtStatus* NewKernel(void** kernel, Args&&... args) {
    try {
      *kernel = new Kernel(std::forward<Args>(args)...);
    } catch (const std::bad_alloc&) {
      return MakeStatus(ORT_FAIL, std::string(Traits::kName) + ": out of memory");
    }
    return nullptr;
  }

  const char* GetName() const { return Traits::kName; }
  size_t GetInputTypeCount() const { return static_cast<size_t>(Traits::kNumInputs); }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return Traits::kInputOptional[index] ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return static_cast<size_t>(Traits::kNumOutputs); }
  ONNXTensorElementDataType GetOutputType(size_t) const { return kElementType<T>; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t index) const {
    return Traits::kOutputOptional[index] ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
};

}  // namespace ortlstm::ort
