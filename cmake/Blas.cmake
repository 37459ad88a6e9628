# Chooses the CBLAS that kernels_cpp/common/blas.cc calls and provides it as the target
# ortlstm::blas. The backend is told to the sources by one macro:
#
#   ORTLSTM_BLAS=mkl (default on x86-64)  oneMKL, sequential, linked statically from the
#       mkl-static and mkl-include wheels (build requirements in pyproject.toml, found through
#       the build's Python), so the installed library needs no BLAS at run time. Its packed GEMM
#       (cblas_?gemm_pack/compute) lets the time loop reuse R in the BLAS's internal layout
#       instead of re-packing it at every step. Sources get ORTLSTM_BLAS_MKL=1.
#   ORTLSTM_BLAS=scipy-openblas32 (default elsewhere, e.g. aarch64)  OpenBLAS from the
#       scipy-openblas32 wheel, also a runtime dependency there. Sources get
#       ORTLSTM_BLAS_PREFIX_SCIPY=1 and call scipy_cblas_*.
#   ORTLSTM_BLAS=system  find_package(BLAS) plus a cblas.h; pick a vendor with BLA_VENDOR.
#       Sources call cblas_*.
#
# Without a packed GEMM (OpenBLAS, system) the kernels run the ordinary GEMM at every step.
#
# Sets ORTLSTM_BLAS_DESCRIPTION (which BLAS, for the library's build line) and
# ORTLSTM_BLAS_SITE_RELATIVE_LIBDIR: the BLAS library's directory relative to
# site-packages when it comes from a wheel (used for the installed RUNPATH), else empty.

if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(_ortlstm_default_blas "mkl")
else()
  set(_ortlstm_default_blas "scipy-openblas32")
endif()
set(ORTLSTM_BLAS "${_ortlstm_default_blas}" CACHE STRING "BLAS backend: mkl, scipy-openblas32 or system")
set_property(CACHE ORTLSTM_BLAS PROPERTY STRINGS mkl scipy-openblas32 system)

add_library(ortlstm_blas INTERFACE)
add_library(ortlstm::blas ALIAS ortlstm_blas)
set(ORTLSTM_BLAS_SITE_RELATIVE_LIBDIR "")

if(ORTLSTM_BLAS STREQUAL "mkl")
  # The wheels put their files under <prefix>/lib and <prefix>/include; their recorded file
  # lists say where that prefix is, also inside pip's isolated build environments.
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c [=[
import importlib.metadata as metadata, os
def directory_of(distribution, name):
    found = metadata.distribution(distribution)
    for entry in found.files or []:
        if entry.name == name:
            return os.path.dirname(os.path.abspath(found.locate_file(entry)))
    raise SystemExit(f"{distribution} is installed but has no {name}")
print(directory_of("mkl-static", "libmkl_core.a") + ";" + directory_of("mkl-include", "mkl_cblas.h")
      + ";" + metadata.version("mkl-static"))
]=]
    OUTPUT_VARIABLE _ortlstm_mkl
    ERROR_VARIABLE _ortlstm_mkl_error
    RESULT_VARIABLE _ortlstm_mkl_result
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _ortlstm_mkl_result EQUAL 0)
    message(FATAL_ERROR
      "ORTLSTM_BLAS=mkl, but ${Python_EXECUTABLE} cannot find the mkl-static and mkl-include "
      "wheels:\n${_ortlstm_mkl_error}"
      "Install them (pip install mkl-static mkl-include) or configure with "
      "-DORTLSTM_BLAS=scipy-openblas32.")
  endif()
  list(GET _ortlstm_mkl 0 _ortlstm_mkl_libdir)
  list(GET _ortlstm_mkl 1 _ortlstm_mkl_includedir)
  list(GET _ortlstm_mkl 2 _ortlstm_mkl_version)
  set(ORTLSTM_BLAS_DESCRIPTION "oneMKL ${_ortlstm_mkl_version} (static, sequential)")
  message(STATUS "BLAS: ${ORTLSTM_BLAS_DESCRIPTION} from ${_ortlstm_mkl_libdir}")
  find_package(Threads REQUIRED)
  # The three libraries refer to each other: one link group. Sequential threading layer: threads
  # come from ORT's pool only. The version script keeps MKL's symbols out of the exports, so this
  # copy cannot clash with another MKL in the process (PyTorch's, numpy's).
  target_link_libraries(ortlstm_blas INTERFACE
    "-Wl,--start-group"
    "${_ortlstm_mkl_libdir}/libmkl_intel_lp64.a"
    "${_ortlstm_mkl_libdir}/libmkl_sequential.a"
    "${_ortlstm_mkl_libdir}/libmkl_core.a"
    "-Wl,--end-group"
    Threads::Threads m ${CMAKE_DL_LIBS})
  target_include_directories(ortlstm_blas SYSTEM INTERFACE "${_ortlstm_mkl_includedir}")
  target_compile_definitions(ortlstm_blas INTERFACE ORTLSTM_BLAS_MKL=1)

elseif(ORTLSTM_BLAS STREQUAL "scipy-openblas32")
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import os, scipy_openblas32 as m; d = m.get_lib_dir(); site = os.path.dirname(os.path.dirname(m.__file__)); print(d + ';' + os.path.relpath(d, site).replace(os.sep, '/'))"
    OUTPUT_VARIABLE _ortlstm_openblas
    ERROR_VARIABLE _ortlstm_openblas_error
    RESULT_VARIABLE _ortlstm_openblas_result
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _ortlstm_openblas_result EQUAL 0)
    message(FATAL_ERROR
      "ORTLSTM_BLAS=scipy-openblas32, but ${Python_EXECUTABLE} cannot import scipy_openblas32:\n"
      "${_ortlstm_openblas_error}"
      "Install it (pip install scipy-openblas32) or configure with -DORTLSTM_BLAS=system.")
  endif()
  list(GET _ortlstm_openblas 0 _ortlstm_openblas_libdir)
  list(GET _ortlstm_openblas 1 ORTLSTM_BLAS_SITE_RELATIVE_LIBDIR)
  # FORCE: an isolated pip build installs scipy-openblas32 into a fresh temporary environment
  # each time, so a path cached by an earlier configure of a reused build dir may be gone.
  set(OpenBLAS_DIR "${_ortlstm_openblas_libdir}/cmake/openblas" CACHE PATH
      "OpenBLAS CMake config of the scipy-openblas32 wheel" FORCE)
  find_package(OpenBLAS CONFIG REQUIRED)
  set(ORTLSTM_BLAS_DESCRIPTION "scipy-openblas32 ${OpenBLAS_VERSION} (shared)")
  message(STATUS "BLAS: ${ORTLSTM_BLAS_DESCRIPTION} from ${_ortlstm_openblas_libdir}")
  target_link_libraries(ortlstm_blas INTERFACE OpenBLAS::OpenBLAS)
  target_compile_definitions(ortlstm_blas INTERFACE ORTLSTM_BLAS_PREFIX_SCIPY=1)

elseif(ORTLSTM_BLAS STREQUAL "system")
  # FindBLAS probes symbols with a C compiler.
  enable_language(C)
  find_package(BLAS REQUIRED)
  find_path(ORTLSTM_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas blis flexiblas
            DOC "Directory containing the system BLAS's cblas.h")
  if(NOT ORTLSTM_CBLAS_INCLUDE_DIR)
    message(FATAL_ERROR "ORTLSTM_BLAS=system: no cblas.h found; set ORTLSTM_CBLAS_INCLUDE_DIR")
  endif()
  # A Fortran-only BLAS links fine but lacks the cblas_* entry points the kernels call.
  include(CheckSymbolExists)
  set(CMAKE_REQUIRED_INCLUDES "${ORTLSTM_CBLAS_INCLUDE_DIR}")
  set(CMAKE_REQUIRED_LIBRARIES BLAS::BLAS)
  check_symbol_exists(cblas_sgemm cblas.h ORTLSTM_HAVE_CBLAS_SGEMM)
  unset(CMAKE_REQUIRED_INCLUDES)
  unset(CMAKE_REQUIRED_LIBRARIES)
  if(NOT ORTLSTM_HAVE_CBLAS_SGEMM)
    message(FATAL_ERROR "ORTLSTM_BLAS=system: ${BLAS_LIBRARIES} does not provide cblas_sgemm "
                        "(try another BLA_VENDOR, e.g. -DBLA_VENDOR=OpenBLAS)")
  endif()
  set(ORTLSTM_BLAS_DESCRIPTION "system (${BLAS_LIBRARIES})")
  message(STATUS "BLAS: system (${BLAS_LIBRARIES}; cblas.h in ${ORTLSTM_CBLAS_INCLUDE_DIR})")
  target_link_libraries(ortlstm_blas INTERFACE BLAS::BLAS)
  target_include_directories(ortlstm_blas SYSTEM INTERFACE "${ORTLSTM_CBLAS_INCLUDE_DIR}")

else()
  message(FATAL_ERROR "ORTLSTM_BLAS='${ORTLSTM_BLAS}': expected mkl, scipy-openblas32 or system")
endif()
