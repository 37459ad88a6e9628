#!/usr/bin/env bash
# Installs the aarch64 wheel in a Debian arm64 root under qemu-user emulation and runs a subset of the
# suite that proves each layer on arm64 (not part of CI: emulation is slow; run it by hand, as root).
#   1. binfmt_misc mounted and qemu-aarch64 registered (Debian: apt-get install qemu-user-static
#      binfmt-support), so the arm64 root's programs run on this x86-64 host.
#   2. A Debian bookworm arm64 root made by debootstrap, cached in .cache/arm64-root/ (not in git).
#   3. In it: a venv (Debian's python3), onnxruntime's aarch64 wheel from PyPI, the aarch64 ortlstm
#      wheel from dist/ (bash scripts/build_wheels.sh aarch64) and the tests' and demo's dependencies.
#   4. The subset, from the checkout's tests/ copied into the root, on the installed wheel:
#      - kernel forward against onnxruntime's own LSTM node   test_lstm_training.py::test_matches_onnxruntime_lstm
#      - float64 central finite differences of the gradients  test_lstm_grad.py::test_matches_finite_differences
#      - the ONNX backend's LSTM and GRU cases (ORT's cases)  test_onnx_backend_cases.py
#      - the checked-in conformance data, both backends       test_conformance.py::test_every_case_passes
#      - one recorded-torch Trainer run, replayed (no torch)  test_train_step_parity.py, one recording
#                                                             (tokens_seq_first_y-dynamo-AdamW)
#      - ortlstm demo, one epoch
#      with the tolerances the tests use on x86-64 (the same test code; nothing is loosened).
# Usage: sudo bash scripts/arm64_emulated.sh [dist/ortlstm-*-manylinux_*_aarch64.whl]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
wheel="${1:-$(ls -t "$root"/dist/ortlstm-*-manylinux_*_aarch64.whl 2>/dev/null | head -n 1)}"
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
  echo "arm64_emulated.sh: no aarch64 wheel '${1:-dist/ortlstm-*-manylinux_*_aarch64.whl}':" \
    "build it first (bash scripts/build_wheels.sh aarch64) or pass its path" >&2
  exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "arm64_emulated.sh: needs root (binfmt_misc, debootstrap, chroot); run it with sudo" >&2
  exit 2
fi
section() { printf '\n=== %s ===\n' "$*"; }

section "qemu-user through binfmt_misc"
if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && command -v update-binfmts >/dev/null; then
  update-binfmts --enable qemu-aarch64
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  echo "arm64_emulated.sh: qemu-aarch64 is not registered with binfmt_misc; install Debian's" \
    "qemu-user-static and binfmt-support (apt-get install qemu-user-static binfmt-support)" >&2
  exit 2
fi
grep -E '^(interpreter|flags)' /proc/sys/fs/binfmt_misc/qemu-aarch64

arm64_root="$root/.cache/arm64-root/bookworm"
if [ ! -x "$arm64_root/usr/bin/python3" ]; then
  section "Debian bookworm arm64 root (debootstrap, cached in .cache/arm64-root)"
  if ! command -v debootstrap >/dev/null; then
    echo "arm64_emulated.sh: debootstrap is missing (apt-get install debootstrap)" >&2
    exit 2
  fi
  rm -rf "$arm64_root"
  mkdir -p "$arm64_root"
  debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$arm64_root" https://deb.debian.org/debian
fi

# /proc and /dev for the interpreter and onnxruntime (CPU count, memory); the host's resolver for pip.
# Not /sys: given the host's CPU lists there and qemu's x86 /proc/cpuinfo, onnxruntime's cpuinfo
# crashes at import (SIGSEGV in onnxruntime_pybind11_state); without them it warns ("cpuinfo_initialize
# failed") and runs. The kernels then take their default L2 size (kernels_cpp/common/cpu_info.h).
mounted=()
cleanup() {
  local index
  for ((index = ${#mounted[@]} - 1; index >= 0; index--)); do
    umount "${mounted[index]}" || true
  done
}
trap cleanup EXIT
for point in proc dev; do
  if ! mountpoint -q "$arm64_root/$point"; then
    mount --bind "/$point" "$arm64_root/$point"
    mounted+=("$arm64_root/$point")
  fi
done
cp /etc/resolv.conf "$arm64_root/etc/resolv.conf"
# The host's CA bundle, which pip inside trusts: where the network reaches PyPI through a proxy with
# its own CA, the root's Debian bundle alone fails with CERTIFICATE_VERIFY_FAILED.
cp "${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}" "$arm64_root/etc/ssl/host-ca-bundle.crt"

# The tests (and the pytest configuration) travel into the root; the wheel too.
work="$arm64_root/root/ortlstm"
rm -rf "$work"
mkdir -p "$work/dist"
cp -a "$root/tests" "$root/pyproject.toml" "$work/"
cp "$wheel" "$work/dist/"
# The emulated CPU: a Neoverse N1 (AWS Graviton2, Ampere Altra), which qemu emulates fully. qemu 7.2's
# default, `max`, also advertises SME, so OpenBLAS picks its armv9sme kernels, whose SME qemu 7.2 does
# not run correctly: every GEMM came back zero. ARM64_QEMU_CPU picks another (qemu-aarch64-static -cpu help).
qemu_cpu="${ARM64_QEMU_CPU:-neoverse-n1}"
in_root() {
  chroot "$arm64_root" /usr/bin/env -i HOME=/root PATH=/opt/venv/bin:/usr/bin:/bin LANG=C.UTF-8 \
    QEMU_CPU="$qemu_cpu" PIP_CERT=/etc/ssl/host-ca-bundle.crt PIP_DEFAULT_TIMEOUT=180 "$@"
}

section "the arm64 root"
in_root /bin/sh -c 'uname -m; . /etc/os-release; echo "$PRETTY_NAME"; python3 --version'

section "install (under emulation)"
start=$SECONDS
if [ ! -x "$arm64_root/opt/venv/bin/python" ]; then
  in_root python3 -m venv /opt/venv
fi
in_root python -m pip install -q --disable-pip-version-check --no-compile --only-binary=:all: \
  onnxruntime "ortlstm[demo,test] @ file:///root/ortlstm/dist/$(basename "$wheel")"
# Always the wheel just built, even where the venv already held an ortlstm of the same version.
in_root python -m pip install -q --disable-pip-version-check --no-compile --force-reinstall --no-deps \
  "/root/ortlstm/dist/$(basename "$wheel")"
echo "installed in $((SECONDS - start)) s"
in_root python -c '
import platform, onnxruntime, ortlstm, ortlstm.ops as ops
print(platform.machine(), "Python", platform.python_version(), "onnxruntime", onnxruntime.__version__)
print("ortlstm", ortlstm.__version__, ops.library_path(), "BLAS", ops.blas_backend())
import ctypes, glob, os
bundled = glob.glob(os.path.join(os.path.dirname(ortlstm.__file__), "..", "ortlstm.libs", "libscipy_openblas*.so"))
core = ctypes.CDLL(bundled[0]).scipy_openblas_get_corename
core.restype = ctypes.c_char_p
print("bundled OpenBLAS kernels for:", core().decode())'

section "tests (under emulation)"
start=$SECONDS
in_root /bin/sh -c 'cd /root/ortlstm
  parity=tests/test_train_step_parity.py::test_parameters_match_torch_after_every_step
  python -m pytest -q -p no:cacheprovider -m "not slow" \
  tests/test_lstm_training.py::test_matches_onnxruntime_lstm \
  tests/test_lstm_grad.py::test_matches_finite_differences \
  tests/test_onnx_backend_cases.py \
  tests/test_conformance.py::test_every_case_passes \
  "$parity[tokens_seq_first_y-dynamo-AdamW]"'
echo "tests took $((SECONDS - start)) s"

section "ortlstm demo, one epoch (under emulation)"
start=$SECONDS
in_root /bin/sh -c 'cd /root/ortlstm && ortlstm demo --epochs 1 --plot demo.png --out demo.onnx'
echo "demo took $((SECONDS - start)) s"
