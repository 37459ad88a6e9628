# Chooses the CBLAS that kernels_cpp/common/blas.h calls and provides it as the target
# ortlstm::blas. Both backends expose <cblas.h>; they differ in symbol names: with
# scipy-openblas32 consumers get ORTLSTM_BLAS_PREFIX_SCIPY=1 and call scipy_cblas_*; with a
# system BLAS the macro is left undefined and they call cblas_* (so both `#ifdef` and `#if`
# tests in the sources read it right).
#
#   ORTLSTM_BLAS=scipy-openblas32 (default)  OpenBLAS from the scipy-openblas32 wheel, which is
#       also a runtime dependency of ortlstm; found through the build's Python.
#   ORTLSTM_BLAS=system  find_package(BLAS) plus a cblas.h; pick a vendor with BLA_VENDOR.
#
# Sets ORTLSTM_BLAS_SITE_RELATIVE_LIBDIR: the BLAS library's directory relative to
# site-packages when it comes from a wheel (used for the installed RUNPATH), else empty.

set(ORTLSTM_BLAS "scipy-openblas32" CACHE STRING "BLAS backend: scipy-openblas32 or system")
set_property(CACHE ORTLSTM_BLAS PROPERTY STRINGS scipy-openblas32 system)

add_library(ortlstm_blas INTERFACE)
add_library(ortlstm::blas ALIAS ortlstm_blas)
set(ORTLSTM_BLAS_SITE_RELATIVE_LIBDIR "")

if(ORTLSTM_BLAS STREQUAL "scipy-openblas32")
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
  message(STATUS "BLAS: scipy-openblas32 ${OpenBLAS_VERSION} (${_ortlstm_openblas_libdir})")
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
  message(STATUS "BLAS: system (${BLAS_LIBRARIES}; cblas.h in ${ORTLSTM_CBLAS_INCLUDE_DIR})")
  target_link_libraries(ortlstm_blas INTERFACE BLAS::BLAS)
  target_include_directories(ortlstm_blas SYSTEM INTERFACE "${ORTLSTM_CBLAS_INCLUDE_DIR}")

else()
  message(FATAL_ERROR "ORTLSTM_BLAS='${ORTLSTM_BLAS}': expected scipy-openblas32 or system")
endif()
