# Chooses the CBLAS backends that kernels_cpp/common/blas*.cc call and provides them as the
# target ortlstm::blas. Each backend linked is told to the sources by one macro; when two are
# linked, common/blas.cc picks one per process at run time (ChooseBlas: by CPU vendor, or
# ORTLSTM_BLAS_BACKEND=mkl|openblas).
#
#   ORTLSTM_BLAS=mkl+scipy-openblas32 (default on x86-64)  both of the next two: oneMKL on Intel
#       CPUs, OpenBLAS on others (AMD: faster there, docs/benchmarks.md).
#   ORTLSTM_BLAS=mkl  oneMKL only, sequential, linked statically from the mkl-static and
#       mkl-include wheels (build requirements in pyproject.toml, found through the build's
#       Python), so it needs nothing at run time. Its packed GEMM (cblas_?gemm_pack/compute) lets
#       the time loop reuse R in the BLAS's internal layout instead of re-packing it at every step.
#       Sources get ORTLSTM_BLAS_MKL=1.
#   ORTLSTM_BLAS=scipy-openblas32 (default elsewhere, e.g. aarch64)  OpenBLAS only, from the
#       scipy-openblas32 wheel (shared; a runtime dependency too). Sources get
#       ORTLSTM_BLAS_PREFIX_SCIPY=1 and call scipy_cblas_*.
#   ORTLSTM_BLAS=system  find_package(BLAS) plus a cblas.h; pick a vendor with BLA_VENDOR.
#       Sources get ORTLSTM_BLAS_SYSTEM=1 and call cblas_*.
#
# Without a packed GEMM (OpenBLAS, system) the kernels run the ordinary GEMM at every step.
#
# Sets ORTLSTM_BLAS_DESCRIPTION (which BLAS, for the library's build line) and
# ORTLSTM_BLAS_SITE_RELATIVE_LIBDIR: the BLAS library's directory relative to
# site-packages when it comes from a wheel (used for the installed RUNPATH), else empty.

if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(_ortlstm_default_blas "mkl+scipy-openblas32")
else()
  set(_ortlstm_default_blas "scipy-openblas32")
endif()
set(ORTLSTM_BLAS "${_ortlstm_default_blas}" CACHE STRING
    "BLAS backend: mkl+scipy-openblas32 (chosen at run time), mkl, scipy-openblas32 or system")
set_property(CACHE ORTLSTM_BLAS PROPERTY STRINGS mkl+scipy-openblas32 mkl scipy-openblas32 system)

add_library(ortlstm_blas INTERFACE)
add_library(ortlstm::blas ALIAS ortlstm_blas)
set(ORTLSTM_BLAS_SITE_RELATIVE_LIBDIR "")
set(ORTLSTM_BLAS_DESCRIPTION "")

if(ORTLSTM_BLAS STREQUAL "mkl+scipy-openblas32")
  set(_ortlstm_blas_parts mkl scipy-openblas32)
elseif(ORTLSTM_BLAS MATCHES "^(mkl|scipy-openblas32|system)$")
  set(_ortlstm_blas_parts "${ORTLSTM_BLAS}")
else()
  message(FATAL_ERROR
    "ORTLSTM_BLAS='${ORTLSTM_BLAS}': expected mkl+scipy-openblas32, mkl, scipy-openblas32 or system")
endif()

if("mkl" IN_LIST _ortlstm_blas_parts)
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
  set(_ortlstm_mkl_description "oneMKL ${_ortlstm_mkl_version} (static, sequential)")
  list(APPEND ORTLSTM_BLAS_DESCRIPTION "${_ortlstm_mkl_description}")
  message(STATUS "BLAS: ${_ortlstm_mkl_description} from ${_ortlstm_mkl_libdir}")
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
endif()

if("scipy-openblas32" IN_LIST _ortlstm_blas_parts)
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
  set(_ortlstm_openblas_description "scipy-openblas32 ${OpenBLAS_VERSION} (shared)")
  list(APPEND ORTLSTM_BLAS_DESCRIPTION "${_ortlstm_openblas_description}")
  message(STATUS "BLAS: ${_ortlstm_openblas_description} from ${_ortlstm_openblas_libdir}")
  target_link_libraries(ortlstm_blas INTERFACE OpenBLAS::OpenBLAS)
  target_compile_definitions(ortlstm_blas INTERFACE ORTLSTM_BLAS_PREFIX_SCIPY=1)
endif()

if("system" IN_LIST _ortlstm_blas_parts)
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
  string(REPLACE ";" " " _ortlstm_blas_libraries "${BLAS_LIBRARIES}")
  set(ORTLSTM_BLAS_DESCRIPTION "system (${_ortlstm_blas_libraries})")
  target_compile_definitions(ortlstm_blas INTERFACE ORTLSTM_BLAS_SYSTEM=1)
  message(STATUS "BLAS: system (${BLAS_LIBRARIES}; cblas.h in ${ORTLSTM_CBLAS_INCLUDE_DIR})")
  target_link_libraries(ortlstm_blas INTERFACE BLAS::BLAS)
  target_include_directories(ortlstm_blas SYSTEM INTERFACE "${ORTLSTM_CBLAS_INCLUDE_DIR}")

endif()

# "oneMKL ... + scipy-openblas32 ..., chosen at run time" when both are linked.
list(LENGTH ORTLSTM_BLAS_DESCRIPTION _ortlstm_blas_count)
list(JOIN ORTLSTM_BLAS_DESCRIPTION " + " ORTLSTM_BLAS_DESCRIPTION)
if(_ortlstm_blas_count GREATER 1)
  string(APPEND ORTLSTM_BLAS_DESCRIPTION ", chosen at run time")
endif()
