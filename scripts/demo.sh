#!/usr/bin/env bash
# Sets up the torch-free demo environment (the newest onnxruntime, scikit-learn, matplotlib, tqdm
# and ortlstm, in .venvs/demo, reused when present) and runs the main job, `ortlstm demo`: a
# bidirectional LSTM digit classifier built as an ONNX model and trained in plain onnxruntime by the
# ortlstm Trainer, then checked in onnxruntime without the ortlstm library. Extra arguments go to
# `ortlstm demo` (see `ortlstm demo --help`); the older torch + onnxruntime-training path is
# `pip install '.[demo-training]'` and `ortlstm demo --runtime onnxruntime-training`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venvs/demo"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q ".[demo]"
"$venv/bin/ortlstm" demo "$@"
