# Provides the ONNX Runtime C/C++ API headers as the imported target onnxruntime::headers.
#
# ORT's Python wheels ship no headers, and the project commits none, so by default they come
# from Debian's libonnxruntime-dev package: downloaded at configure time, SHA256-checked, and
# unpacked into the build tree, where later configures reuse them. The headers are the same
# for every architecture, so the amd64 package serves any build host.
#
# Cache variables:
#   ORT_INCLUDE_DIR        directory holding onnxruntime_cxx_api.h; set it to skip the download.
#   ORTLSTM_DEBIAN_MIRROR  Debian mirror root.
#   ORTLSTM_DEBIAN_SUITES  suites whose Packages index names the current .deb when the pinned
#                          one has left the pool (Debian drops superseded versions).

# The kernels request C API version 19 (the newest onnxruntime-training 1.19.2 accepts), so any
# header at least that new declares every function they may call.
set(_ortlstm_min_ort_api_version 19)

# The pinned package: Debian experimental's 1.27 headers, because C API version 25 (ORT 1.25)
# added the string-list attribute reader the kernels use for `activations` on new runtimes
# (kernels_cpp/ort/ort_util.h); older headers still build, without that path. Variables, not cache entries, so that bumping the pin here takes effect in
# existing build trees; -D on the command line still overrides them (e.g. to test the fallback).
if(NOT DEFINED ORTLSTM_ORT_DEB_POOL_PATH)
  set(ORTLSTM_ORT_DEB_POOL_PATH "pool/main/o/onnxruntime/libonnxruntime-dev_1.27.1+dfsg-1_amd64.deb")
endif()
if(NOT DEFINED ORTLSTM_ORT_DEB_SHA256)
  set(ORTLSTM_ORT_DEB_SHA256 "521b439b4674dbd71da1d0bc3016f29075c6ad572f4a1c13beb011dee893f8f3")
endif()

set(ORT_INCLUDE_DIR "" CACHE PATH
    "Directory containing onnxruntime_cxx_api.h; empty: download Debian's libonnxruntime-dev")
set(ORTLSTM_DEBIAN_MIRROR "https://deb.debian.org/debian" CACHE STRING
    "Debian mirror used to fetch the ONNX Runtime headers")
set(ORTLSTM_DEBIAN_SUITES "experimental;sid;testing;trixie;stable" CACHE STRING
    "Debian suites searched, in order, when the pinned libonnxruntime-dev is gone")
mark_as_advanced(ORTLSTM_DEBIAN_MIRROR ORTLSTM_DEBIAN_SUITES)

# Downloads url to dest and checks its SHA256. Sets ok_var to FALSE if the download itself
# fails (the caller decides whether that is fatal). A hash mismatch is always fatal: pool
# files never change, so a mismatch means corruption or tampering, not a moved package.
# (file(DOWNLOAD EXPECTED_HASH) cannot express this: it aborts on a 404 even with STATUS.)
function(_ortlstm_download_checked url dest sha256 ok_var)
  file(DOWNLOAD "${url}" "${dest}" STATUS status TLS_VERIFY ON)
  list(GET status 0 code)
  if(NOT code EQUAL 0)
    file(REMOVE "${dest}")
    list(GET status 1 reason)
    message(STATUS "Download failed: ${url}: ${reason}")
    set(${ok_var} FALSE PARENT_SCOPE)
    return()
  endif()
  file(SHA256 "${dest}" actual)
  if(NOT actual STREQUAL sha256)
    file(REMOVE "${dest}")
    message(FATAL_ERROR "SHA256 mismatch for ${url}\n  expected ${sha256}\n  actual   ${actual}")
  endif()
  set(${ok_var} TRUE PARENT_SCOPE)
endfunction()

# Asks the suites' Packages indexes for the current libonnxruntime-dev; sets pool_path_var and
# sha256_var, or stops with a message naming the override.
function(_ortlstm_resolve_from_index pool_path_var sha256_var)
  if(NOT Python_EXECUTABLE)
    message(FATAL_ERROR "Resolving libonnxruntime-dev needs Python_EXECUTABLE (find_package(Python))")
  endif()
  set(suite_args "")
  foreach(suite IN LISTS ORTLSTM_DEBIAN_SUITES)
    list(APPEND suite_args --suite "${suite}")
  endforeach()
  message(STATUS "Looking up libonnxruntime-dev in the Debian index (${ORTLSTM_DEBIAN_SUITES})")
  execute_process(
    COMMAND "${Python_EXECUTABLE}" "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/debian_package_lookup.py"
            --mirror "${ORTLSTM_DEBIAN_MIRROR}" ${suite_args} libonnxruntime-dev
    OUTPUT_VARIABLE found
    ERROR_VARIABLE lookup_log
    RESULT_VARIABLE result
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR
      "Could not obtain the ONNX Runtime headers: no Debian suite in ORTLSTM_DEBIAN_SUITES "
      "(${ORTLSTM_DEBIAN_SUITES}) lists libonnxruntime-dev.\n${lookup_log}"
      "Pass -DORT_INCLUDE_DIR=<dir containing onnxruntime_cxx_api.h> to use headers you have "
      "(with pip: -C cmake.define.ORT_INCLUDE_DIR=<dir>).")
  endif()
  list(GET found 0 pool_path)
  list(GET found 1 sha256)
  list(GET found 2 version)
  list(GET found 3 suite)
  message(STATUS "Debian ${suite} has libonnxruntime-dev ${version}")
  set(${pool_path_var} "${pool_path}" PARENT_SCOPE)
  set(${sha256_var} "${sha256}" PARENT_SCOPE)
endfunction()

# Unpacks usr/include/onnxruntime (and the package's copyright file, for provenance) from a
# .deb into dest_dir. Extracts to a scratch dir and renames at the end, so an interrupted
# configure never leaves a half-filled cache that later runs would trust.
function(_ortlstm_unpack_deb deb dest_dir)
  set(scratch "${dest_dir}.partial")
  file(REMOVE_RECURSE "${scratch}")
  # A .deb is an ar archive whose data.tar.<compression> member holds the file tree.
  file(ARCHIVE_EXTRACT INPUT "${deb}" DESTINATION "${scratch}/deb" PATTERNS "data.tar.*")
  file(GLOB data_tar "${scratch}/deb/data.tar.*")
  list(LENGTH data_tar n_data_tar)
  if(NOT n_data_tar EQUAL 1)
    message(FATAL_ERROR "${deb}: expected one data.tar.* member, found '${data_tar}'")
  endif()
  file(ARCHIVE_EXTRACT INPUT "${data_tar}" DESTINATION "${scratch}/tree"
       PATTERNS "usr/include/onnxruntime" "usr/share/doc/libonnxruntime-dev/copyright")
  if(NOT EXISTS "${scratch}/tree/usr/include/onnxruntime/onnxruntime_cxx_api.h")
    message(FATAL_ERROR "${deb} has no usr/include/onnxruntime/onnxruntime_cxx_api.h")
  endif()
  file(REMOVE_RECURSE "${dest_dir}")
  file(MAKE_DIRECTORY "${dest_dir}")
  if(EXISTS "${scratch}/tree/usr/share/doc/libonnxruntime-dev/copyright")
    file(RENAME "${scratch}/tree/usr/share/doc/libonnxruntime-dev/copyright" "${dest_dir}/copyright")
  endif()
  file(RENAME "${scratch}/tree/usr/include/onnxruntime" "${dest_dir}/include")
  file(REMOVE_RECURSE "${scratch}")
endfunction()

# Sets out_var to a directory containing onnxruntime_cxx_api.h, downloading it if needed.
function(_ortlstm_find_or_fetch_ort_headers out_var)
  if(ORT_INCLUDE_DIR)
    if(NOT EXISTS "${ORT_INCLUDE_DIR}/onnxruntime_cxx_api.h")
      message(FATAL_ERROR "ORT_INCLUDE_DIR=${ORT_INCLUDE_DIR} has no onnxruntime_cxx_api.h")
    endif()
    set(${out_var} "${ORT_INCLUDE_DIR}" PARENT_SCOPE)
    return()
  endif()

  # Keyed by the pin, so a new pin fetches anew; whatever the pin resolved to (itself or the
  # index's current version) is kept here.
  get_filename_component(pinned_name "${ORTLSTM_ORT_DEB_POOL_PATH}" NAME_WLE)
  set(cache_dir "${CMAKE_BINARY_DIR}/_deps/ort-headers/${pinned_name}")
  if(EXISTS "${cache_dir}/include/onnxruntime_cxx_api.h")
    set(${out_var} "${cache_dir}/include" PARENT_SCOPE)
    return()
  endif()

  set(pool_path "${ORTLSTM_ORT_DEB_POOL_PATH}")
  set(sha256 "${ORTLSTM_ORT_DEB_SHA256}")
  get_filename_component(deb_name "${pool_path}" NAME)
  set(deb "${CMAKE_BINARY_DIR}/_deps/ort-headers/download/${deb_name}")
  message(STATUS "Downloading ONNX Runtime headers: ${ORTLSTM_DEBIAN_MIRROR}/${pool_path}")
  _ortlstm_download_checked("${ORTLSTM_DEBIAN_MIRROR}/${pool_path}" "${deb}" "${sha256}" ok)
  if(NOT ok)
    _ortlstm_resolve_from_index(pool_path sha256)
    get_filename_component(deb_name "${pool_path}" NAME)
    set(deb "${CMAKE_BINARY_DIR}/_deps/ort-headers/download/${deb_name}")
    message(STATUS "Downloading ONNX Runtime headers: ${ORTLSTM_DEBIAN_MIRROR}/${pool_path}")
    _ortlstm_download_checked("${ORTLSTM_DEBIAN_MIRROR}/${pool_path}" "${deb}" "${sha256}" ok)
    if(NOT ok)
      message(FATAL_ERROR
        "Could not download ${ORTLSTM_DEBIAN_MIRROR}/${pool_path}. Pass "
        "-DORT_INCLUDE_DIR=<dir containing onnxruntime_cxx_api.h> to use headers you have.")
    endif()
  endif()
  _ortlstm_unpack_deb("${deb}" "${cache_dir}")
  file(WRITE "${cache_dir}/SOURCE.txt"
       "${ORTLSTM_DEBIAN_MIRROR}/${pool_path}\nSHA256 ${sha256}\n")
  file(REMOVE "${deb}")
  set(${out_var} "${cache_dir}/include" PARENT_SCOPE)
endfunction()

_ortlstm_find_or_fetch_ort_headers(_ortlstm_ort_include_dir)

file(STRINGS "${_ortlstm_ort_include_dir}/onnxruntime_c_api.h" _ortlstm_api_line
     REGEX "^#define ORT_API_VERSION [0-9]+")
string(REGEX REPLACE "^#define ORT_API_VERSION ([0-9]+).*" "\\1" ORTLSTM_ORT_API_VERSION "${_ortlstm_api_line}")
if(NOT ORTLSTM_ORT_API_VERSION OR ORTLSTM_ORT_API_VERSION LESS _ortlstm_min_ort_api_version)
  message(FATAL_ERROR "${_ortlstm_ort_include_dir}: ORT_API_VERSION '${ORTLSTM_ORT_API_VERSION}' "
                      "is older than the ${_ortlstm_min_ort_api_version} the kernels need")
endif()
message(STATUS "ONNX Runtime headers: ${_ortlstm_ort_include_dir} (ORT_API_VERSION ${ORTLSTM_ORT_API_VERSION})")

# IMPORTED, so its include directory is a system one: warnings inside ORT's headers stay out
# of -Werror builds.
add_library(onnxruntime::headers INTERFACE IMPORTED)
set_target_properties(onnxruntime::headers PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${_ortlstm_ort_include_dir}"
  # The custom-op library must not link libonnxruntime (the Python wheels do not export
  # OrtGetApiBase): RegisterCustomOps receives the API from ORT and calls Ort::InitApi.
  # Defined empty so a source's own `#define ORT_API_MANUAL_INIT` is an identical, legal
  # redefinition; defined here so no translation unit can miss it.
  INTERFACE_COMPILE_DEFINITIONS "ORT_API_MANUAL_INIT=")
