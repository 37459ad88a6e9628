// The library's entry point and its only table of kernels: ORT calls RegisterCustomOps when a
// session registers the library; it adds the ortlstm domain with every op of ort/lstm_ops.cc and
// ort/optimizer_ops.cc, ort/ctc_ops.cc, ort/conv_ops.cc and ort/activation_grad_ops.cc.
#include <string>

#include "common/bf16_gemm.h"
#include "common/blas.h"
#include "generated/op_schema.h"
#include "ort/activation_grad_ops.h"
#include "ort/conv_ops.h"
#include "ort/ctc_ops.h"
#include "ort/gru_ops.h"
#include "ort/lstm_ops.h"
#include "ort/optimizer_ops.h"
#include "ort/rnn_ops.h"
#include "ort/ort_util.h"

#ifndef ORTLSTM_BUILD_BLAS
#define ORTLSTM_BUILD_BLAS "unknown"
#endif

// How the library was built, as a string in its data that tools can find without loading it
// (benchmarks/bench_lstm.py; `strings libortlstm_ops.so | grep ortlstm-build`).
extern "C" __attribute__((used, visibility("hidden"))) const char ortlstm_build_line[] =
    "ortlstm-build: BLAS " ORTLSTM_BUILD_BLAS;

namespace {

// "1.19.2" -> 19 (ORT's C API version equals its minor release number); -1 if unparsable.
int MinorVersion(const char* version) {
  if (version == nullptr) return -1;
  const std::string text(version);
  const auto first = text.find('.');
  if (first == std::string::npos || text.compare(0, first, "1") != 0) return -1;
  try {
    return std::stoi(text.substr(first + 1));
  } catch (...) {
    return -1;
  }
}

OrtStatus* Register(OrtSessionOptions* options, const OrtApiBase* api_base) {
  using ortlstm::ort::Api;
  const OrtApi* api = api_base->GetApi(ortlstm::ort::kOrtApiVersion);
  if (api == nullptr) {
    // Version 1 of the API exists in every release and can still report the problem.
    const OrtApi* oldest = api_base->GetApi(1);
    const std::string message = std::string("ortlstm needs onnxruntime >= 1.19 (C API version ") +
                                std::to_string(ortlstm::ort::kOrtApiVersion) + "); this is onnxruntime " +
                                api_base->GetVersionString();
    return oldest != nullptr ? oldest->CreateStatus(ORT_FAIL, message.c_str()) : nullptr;
  }
  Ort::InitApi(api);
  // Only newer runtimes hand string-list attributes (activations) to custom kernels. Older ones
  // print to stderr when asked for an API version they lack, so ask only when the release has it.
  const int release_minor = MinorVersion(api_base->GetVersionString());
  const OrtApi* string_arrays = nullptr;
  if (ORT_API_VERSION >= ortlstm::ort::kOrtApiVersionStringArrays &&
      release_minor >= ortlstm::ort::kOrtApiVersionStringArrays) {
    string_arrays = api_base->GetApi(ortlstm::ort::kOrtApiVersionStringArrays);
  }
  ortlstm::ort::SetRuntime(api, string_arrays, release_minor);
  // The GEMM backend for this process, by CPU or ORTLSTM_BLAS_BACKEND (common/blas.h).
  const std::string blas_error = ortlstm::ChooseBlas();
  if (!blas_error.empty()) return ortlstm::ort::MakeStatus(ORT_INVALID_ARGUMENT, "ortlstm: " + blas_error);
  // And of matmul_precision="bfloat16", by CPU or ORTLSTM_BF16_GEMM (common/bf16_gemm.h).
  const std::string bf16_error = ortlstm::ChooseBf16Gemm();
  if (!bf16_error.empty()) return ortlstm::ort::MakeStatus(ORT_INVALID_ARGUMENT, "ortlstm: " + bf16_error);
  // Threads come from ORT's intra-op pool only (common/parallel.h).
  ortlstm::UseSingleThreadedBlas();

  // The domain must outlive every session created from `options`; ORT does not take ownership,
  // so it is deliberately never released (one small object per registration).
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* status = Api().CreateCustomOpDomain(ortlstm::schema::kDomain, &domain)) return status;
  std::string error = ortlstm::ort::AddLstmOps(domain);
  if (error.empty()) error = ortlstm::ort::AddGruOps(domain);
  if (error.empty()) error = ortlstm::ort::AddRnnOps(domain);
  if (error.empty()) error = ortlstm::ort::AddOptimizerOps(domain);
  if (error.empty()) error = ortlstm::ort::AddCtcOps(domain);
  if (error.empty()) error = ortlstm::ort::AddConvOps(domain);
  if (error.empty()) error = ortlstm::ort::AddActivationGradOps(domain);
  if (!error.empty()) {
    Api().ReleaseCustomOpDomain(domain);
    return ortlstm::ort::MakeStatus(ORT_FAIL, "ortlstm: registering the ops failed: " + error);
  }
  if (OrtStatus* status = Api().AddCustomOpDomain(options, domain)) {
    Api().ReleaseCustomOpDomain(domain);
    return status;
  }
  return nullptr;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  return Register(options, api_base);
}

// The GEMM backend this process uses, "mkl", "openblas", "openblas+mkl" or "system": the one RegisterCustomOps
// chose, or, before any registration, the one it will choose (and from then on keeps). NULL if
// ORTLSTM_BLAS_BACKEND names no backend this build links. For tools and tests, through ctypes
// (ortlstm.ops.library.blas_backend); needs no ONNX Runtime.
extern "C" __attribute__((visibility("default"))) const char* OrtLstmBlasBackend(void) {
  return ortlstm::BlasBackendName();
}
