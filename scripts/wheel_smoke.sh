#!/usr/bin/env bash
# Proves that a binary wheel installs and trains with no compiler: a fresh venv, a PATH that holds
# only that venv's bin/ and a directory of links to the few tools the run needs (no cc, gcc, g++, c++,
# ld or cmake anywhere on it), CC/CXX unset; the wheel itself installed with --no-index --no-deps (no
# network, no build), then its dependencies and onnxruntime from PyPI; then `ortlstm demo` (a short
# run) and the kernel smoke tests against the installed package, not the checkout.
# Usage: bash scripts/wheel_smoke.sh [dist/ortlstm-*-manylinux_*_x86_64.whl]   (default: the newest)
# scripts/test.sh runs it after scripts/build_wheels.sh x86_64 (CI).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export PIP_DISABLE_PIP_VERSION_CHECK=1
python="${PYTHON:-python3}"
wheel="${1:-$(ls -t "$root"/dist/ortlstm-*-manylinux_*_"$(uname -m)".whl 2>/dev/null | head -n 1)}"
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
  echo "wheel_smoke.sh: no wheel '${1:-dist/ortlstm-*-manylinux_*_$(uname -m).whl}': build it first" \
    "(bash scripts/build_wheels.sh $(uname -m)) or pass its path" >&2
  exit 2
fi
wheel="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"

venv="$root/.venvs/wheel-smoke"
rm -rf "$venv"
"$python" -m venv "$venv"
# The only directories on PATH: the venv's bin/ and these links (bash and coreutils for the
# commands below; pip and the tests call nothing else).
tools="$venv/no-compiler-bin"
mkdir -p "$tools"
for tool in bash sh env ls cat mkdir rm mktemp uname dirname basename head; do
  ln -sf "$(command -v "$tool")" "$tools/$tool"
done
export PATH="$venv/bin:$tools"
unset CC CXX CPP LD CFLAGS CXXFLAGS LDFLAGS CMAKE_ARGS
for compiler in cc gcc g++ c++ clang clang++ ld cmake; do
  if command -v "$compiler" >/dev/null; then
    echo "wheel_smoke.sh: $compiler is still on PATH ($(command -v "$compiler")): the proof needs it hidden" >&2
    exit 1
  fi
done
echo "PATH=$PATH (no compiler on it)"

start=$SECONDS
# No index, no dependencies: nothing can be downloaded or built for ortlstm itself.
"$venv/bin/python" -m pip install -q --no-index --no-deps "$wheel"
echo "wheel installed without network or compiler in $((SECONDS - start)) s: $(basename "$wheel")"
start=$SECONDS
# Its dependencies, onnxruntime and the demo's and tests' packages: binary wheels from PyPI only.
"$venv/bin/python" -m pip install -q --no-compile --only-binary=:all: "ortlstm[demo,test] @ file://$wheel"
echo "dependencies installed in $((SECONDS - start)) s"

work="$(mktemp -d)"
cd "$work"
# The library that loads must be the wheel's, with its bundled OpenBLAS.
"$venv/bin/python" - "$venv" <<'EOF'
import sys, pathlib
import onnxruntime, ortlstm, ortlstm.ops as ops
venv = pathlib.Path(sys.argv[1]).resolve()
library = pathlib.Path(ops.library_path()).resolve()
assert venv in library.parents, f"the kernel library {library} is not the installed wheel's (under {venv})"
print(f"ortlstm {ortlstm.__version__}, onnxruntime {onnxruntime.__version__}, {library}, BLAS {ops.blas_backend()}")
EOF
start=$SECONDS
"$venv/bin/ortlstm" demo --epochs 2 --plot "$work/demo.png" --out "$work/demo.onnx"
echo "ortlstm demo (2 epochs) took $((SECONDS - start)) s"

# Kernel smoke tests: forward against onnxruntime's LSTM, float64 finite differences, ORT's own
# cases, the optimizer update and the BLAS backend, run from the checkout's tests/ on the installed
# package (its src/ is not on sys.path: the venv's pytest, started outside the checkout).
start=$SECONDS
"$venv/bin/pytest" -q -p no:cacheprovider --rootdir "$root" -c "$root/pyproject.toml" -m "not slow" \
  "$root/tests/test_lstm_training.py::test_matches_onnxruntime_lstm" \
  "$root/tests/test_lstm_grad.py::test_matches_finite_differences" \
  "$root/tests/test_onnx_backend_cases.py" "$root/tests/test_adam_update.py" "$root/tests/test_blas_backend.py"
echo "kernel smoke tests took $((SECONDS - start)) s"
rm -rf "$work"
