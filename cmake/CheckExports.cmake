# Run after linking (cmake -DLIBRARY=<.so> -DNM=<nm> -P CheckExports.cmake): fails unless the
# library's dynamic symbol table defines exactly RegisterCustomOps (for ONNX Runtime) and
# OrtLstmBlasBackend (which GEMM backend the process uses, for tools; kernels_cpp/register.cc) and the bf16
# GEMM layer's probes for tests and benchmarks (kernels_cpp/common/bf16_probe.cc).
#
# With -fvisibility=hidden the source must mark each visible itself: a version
# script cannot export a hidden symbol, and ORT_EXPORT from onnxruntime_c_api.h is empty on
# Linux. Without this check the omission surfaces only when ORT fails to find the function.
execute_process(COMMAND "${NM}" -D --defined-only "${LIBRARY}"
                OUTPUT_VARIABLE table RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${LIBRARY}")
endif()
string(REGEX MATCHALL "[^\n]+" lines "${table}")
set(exported "")
foreach(line IN LISTS lines)
  # Lines are "<address> <type> <name>"; absolute (A) entries are version nodes, not symbols.
  if(line MATCHES "^[0-9a-fA-F]+ ([^A ]) ([^ ]+)$")
    list(APPEND exported "${CMAKE_MATCH_2}")
  endif()
endforeach()
list(SORT exported)
set(expected OrtLstmBf16GemmBackend OrtLstmBlasBackend OrtLstmCoreRoundTripNs OrtLstmCpuHasBf16Units
             OrtLstmGemmBf16 OrtLstmRoundToBfloat16 RegisterCustomOps)
if(NOT exported STREQUAL expected)
  message(FATAL_ERROR
    "${LIBRARY} must export exactly ${expected}, but exports: '${exported}'.\n"
    "Define it as: extern \"C\" __attribute__((visibility(\"default\"))) OrtStatus* ORT_API_CALL "
    "RegisterCustomOps(OrtSessionOptions*, const OrtApiBase*)")
endif()
