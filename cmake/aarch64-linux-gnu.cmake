# CMake toolchain file for cross-building libortlstm_ops.so for 64-bit Arm Linux (aarch64) with
# Debian's cross compiler (apt-get install g++-aarch64-linux-gnu). scripts/build_wheels.sh uses it
# for the aarch64 wheel; by hand:
#   cmake -S . -B build/aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# The BLAS is OpenBLAS from the scipy-openblas32 aarch64 wheel (cmake/Blas.cmake asks the build's
# Python for it, so that Python must import the aarch64 package: build_wheels.sh puts an unpacked
# copy first on PYTHONPATH). No -march: Advanced SIMD (NEON) is part of the armv8-a baseline, so the
# pointwise loops vectorise for it in the one build, with no target_clones (those are x86-only).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Libraries and headers come from the target's tree only; programs (python, the build tools) from
# the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
