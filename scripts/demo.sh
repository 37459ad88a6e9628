#!/usr/bin/env bash
# Sets up the torch-free demo environment (the newest onnxruntime, scikit-learn, matplotlib, tqdm
# and ortlstm, in .venvs/demo) and runs the main job, `ortlstm demo`: a bidirectional LSTM digit
# classifier built as an ONNX model and trained in plain onnxruntime by the ortlstm Trainer, then
# checked in onnxruntime without the ortlstm library. Extra arguments go to `ortlstm demo` (see
# `ortlstm demo --help`; --out and --plot override the paths below); the older torch +
# onnxruntime-training path is `pip install '.[demo-training]'` and
# `ortlstm demo --runtime onnxruntime-training`.
#
# The first run builds and installs ortlstm (a minute or more: the C++ library); later runs reuse
# the environment as long as it is up to date with the checkout: .venvs/demo/ortlstm-sources.sha256
# records a hash of every file the install is built from, and pip runs again only when it differs
# (ORTLSTM_DEMO_REINSTALL=1 forces it). The trained model and the plot go to runs/demo/ (git
# ignores runs/), or to $ORTLSTM_DEMO_DIR.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venvs/demo"
stamp="$venv/ortlstm-sources.sha256"
out_dir="${ORTLSTM_DEMO_DIR:-$root/runs/demo}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# What `pip install ".[demo]"` builds from: the build files, the C++ sources, and the Python
# packages the wheel maps in (src/ortlstm, ops/, graphs/); never caches or build outputs.
sources_hash() {
  {
    echo "pip install .[demo]"
    find pyproject.toml CMakeLists.txt cmake kernels_cpp ops graphs src -type f \
      ! -path '*/__pycache__/*' ! -name '*.pyc' ! -name '*.so' -print0 \
      | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -d' ' -f1
}

wanted="$(sources_hash)"
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
if [ "${ORTLSTM_DEMO_REINSTALL:-0}" != 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] \
  && "$venv/bin/ortlstm" --version >/dev/null 2>&1; then
  echo "demo environment $venv is up to date with the sources (ORTLSTM_DEMO_REINSTALL=1 reinstalls)"
else
  rm -f "$stamp"
  echo "installing ortlstm into $venv (builds the C++ library; later runs reuse it)"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q ".[demo]"
  echo "$wanted" >"$stamp"
fi

mkdir -p "$out_dir"
"$venv/bin/ortlstm" demo --out "$out_dir/ortlstm_demo.onnx" --plot "$out_dir/ortlstm_demo.png" "$@"
