#!/usr/bin/env bash
# Sets up the training environment (onnxruntime-training-cpu 1.19.2, torch CPU, scikit-learn,
# matplotlib and ortlstm, in .venvs/train, reused when present) and runs the main job,
# `ortlstm demo`: a bidirectional LSTM classifier exported from PyTorch, converted and trained in
# ONNX Runtime. Extra arguments go to `ortlstm demo` (see `ortlstm demo --help`).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venvs/train"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q ".[demo]"
"$venv/bin/ortlstm" demo "$@"
