# The oneDNN bf16 GEMM backend (kernels_cpp/common/bf16_onednn.cc) needs oneDNN's C API headers at
# build time only, from the onednn-devel-cpu-gomp wheel (a build requirement in pyproject.toml on
# x86-64, found through the build's Python as the oneMKL wheels are in cmake/Blas.cmake). Nothing is
# linked: libdnnl.so.3 comes from the onednn-cpu-gomp wheel (a runtime dependency) and is dlopen'ed
# from that wheel's path at the first bf16 GEMM. So a wheel repair (auditwheel) never sees it and
# must not bundle it; do not add it to target_link_libraries.
#
#   ORTLSTM_ONEDNN=AUTO (default on x86-64)  the backend where the headers are found, else a warning
#       and a build without it (matmul_precision="bfloat16" then runs on oneMKL or the fallback).
#   ORTLSTM_ONEDNN=ON   the headers are required.     ORTLSTM_ONEDNN=OFF  no oneDNN backend.
#
# Provides ortlstm::onednn_headers (an include directory and ORTLSTM_ONEDNN=1, or nothing).

if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(_ortlstm_onednn_default AUTO)
else()
  set(_ortlstm_onednn_default OFF)
endif()
set(ORTLSTM_ONEDNN "${_ortlstm_onednn_default}" CACHE STRING "oneDNN bf16 GEMM backend: AUTO, ON or OFF")
set_property(CACHE ORTLSTM_ONEDNN PROPERTY STRINGS AUTO ON OFF)

add_library(ortlstm_onednn_headers INTERFACE)
add_library(ortlstm::onednn_headers ALIAS ortlstm_onednn_headers)

if(NOT ORTLSTM_ONEDNN STREQUAL "OFF")
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c [=[
import importlib.metadata as metadata, os
found = metadata.distribution("onednn-devel-cpu-gomp")
for entry in found.files or []:
    if entry.name == "dnnl.h" and entry.parent.name == "dnnl":
        header = os.path.abspath(found.locate_file(entry))
        print(os.path.dirname(os.path.dirname(os.path.dirname(header))) + ";" + found.version)
        break
else:
    raise SystemExit("onednn-devel-cpu-gomp is installed but has no oneapi/dnnl/dnnl.h")
]=]
    OUTPUT_VARIABLE _ortlstm_onednn
    ERROR_VARIABLE _ortlstm_onednn_error
    RESULT_VARIABLE _ortlstm_onednn_result
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_ortlstm_onednn_result EQUAL 0)
    list(GET _ortlstm_onednn 0 _ortlstm_onednn_includedir)
    list(GET _ortlstm_onednn 1 _ortlstm_onednn_version)
    message(STATUS "oneDNN bf16 backend: headers ${_ortlstm_onednn_version} from ${_ortlstm_onednn_includedir} "
                   "(libdnnl is loaded at run time)")
    target_include_directories(ortlstm_onednn_headers SYSTEM INTERFACE "${_ortlstm_onednn_includedir}")
    target_compile_definitions(ortlstm_onednn_headers INTERFACE ORTLSTM_ONEDNN=1)
    target_link_libraries(ortlstm_onednn_headers INTERFACE ${CMAKE_DL_LIBS})
  elseif(ORTLSTM_ONEDNN STREQUAL "ON")
    message(FATAL_ERROR
      "ORTLSTM_ONEDNN=ON, but ${Python_EXECUTABLE} cannot find the onednn-devel-cpu-gomp wheel:\n"
      "${_ortlstm_onednn_error}Install it (pip install onednn-devel-cpu-gomp==2023.2.0) or configure with "
      "-DORTLSTM_ONEDNN=OFF.")
  else()
    message(WARNING
      "oneDNN headers not found (pip install onednn-devel-cpu-gomp==2023.2.0): building without the onednn "
      "bf16 GEMM backend.\n${_ortlstm_onednn_error}")
  endif()
endif()
