"""The GEMM backend: chosen once per process by CPU vendor or ORTLSTM_BLAS_BACKEND, and really used.

On x86-64 the kernel library links oneMKL and OpenBLAS and picks one when it is first registered
(kernels_cpp/common/blas.cc); ``ortlstm.ops.blas_backend()`` reads the choice through the
library's ``OrtLstmBlasBackend``. scripts/test.sh runs the kernel tests once more with the
non-default backend forced. Scenarios that set the variable run in a child process (the choice is
per process), with cwd outside the checkout so that the child imports the installed package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ortlstm.ops

VARIABLE = "ORTLSTM_BLAS_BACKEND"
TESTS = str(Path(__file__).resolve().parent)


def _build_line() -> str:
    data = Path(ortlstm.ops.library_path()).read_bytes()
    at = data.find(b"ortlstm-build: ")
    return data[at : data.index(b"\0", at)].decode() if at >= 0 else ""


def _linked() -> list[str]:
    line = _build_line()
    return [name for name, marker in (("mkl", "oneMKL"), ("openblas", "scipy-openblas32")) if marker in line]


def _cpu_vendor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _run_child(code: str, backend: str | None) -> dict:
    env = dict(os.environ)
    env.pop(VARIABLE, None)
    if backend is not None:
        env[VARIABLE] = backend
    prelude = textwrap.dedent(
        f"""
        import json, os, sys
        import numpy as np
        sys.path.insert(0, {TESTS!r})
        import onnxruntime as ort
        import op_runner
        import ortlstm.ops

        def run_lstm(batch=3):
            rng = np.random.default_rng(0)
            model = op_runner.make_model("LSTMTraining", ["X", "W", "R"], ["HAll", "Ht"], np.float32,
                                         {{"hidden_size": 16}})
            session = ort.InferenceSession(model.SerializeToString(), ortlstm.ops.session_options(),
                                           providers=["CPUExecutionProvider"])
            feeds = {{"X": rng.standard_normal((5, batch, 8)).astype(np.float32),
                      "W": rng.standard_normal((1, 64, 8)).astype(np.float32) * 0.2,
                      "R": rng.standard_normal((1, 64, 16)).astype(np.float32) * 0.2}}
            return session.run(["Ht"], feeds)[0]
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(TESTS).anchor,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_backend_in_this_process_is_the_forced_or_automatic_one():
    backend = ortlstm.ops.blas_backend()
    forced = os.environ.get(VARIABLE)
    if forced:
        assert backend == forced
    elif _linked() == ["mkl", "openblas"]:
        assert backend == ("mkl" if _cpu_vendor() == "GenuineIntel" else "openblas+mkl")
    else:
        assert backend in ("mkl", "openblas", "system")


@pytest.mark.parametrize("backend", ["mkl", "openblas", "openblas+mkl"])
def test_forced_backend_is_used(backend):
    if not set(backend.split("+")) <= set(_linked()):
        pytest.skip(f"this build does not link {backend}: {_build_line()}")
    out = _run_child(
        """
        before = ortlstm.ops.blas_backend()
        ht = run_lstm()
        after = ortlstm.ops.blas_backend()
        print(json.dumps({"before": before, "after": after, "finite": bool(np.isfinite(ht).all())}))
        """,
        backend,
    )
    assert out == {"before": backend, "after": backend, "finite": True}


@pytest.mark.parametrize("batch", [3, 1])
def test_backends_agree_closely(batch):
    # Batch 1: one-row GEMMs, which openblas+mkl routes by the CPU (AVX-512: OpenBLAS; common/blas.cc).
    if len(_linked()) < 2:
        pytest.skip(f"one backend linked: {_build_line()}")
    code = f'print(json.dumps({{"ht": run_lstm({batch}).ravel().tolist()}}))'
    mkl = _run_child(code, "mkl")["ht"]
    for other in ("openblas", "openblas+mkl"):
        values = _run_child(code, other)["ht"]
        assert max(abs(a - b) for a, b in zip(mkl, values, strict=True)) < 1e-5


def test_bad_value_is_refused_clearly():
    out = _run_child(
        """
        errors = {}
        try:
            ortlstm.ops.blas_backend()
        except ValueError as error:
            errors["query"] = str(error)
        try:
            run_lstm()
        except Exception as error:
            errors["register"] = str(error)
        print(json.dumps(errors))
        """,
        "openblass",
    )
    assert "ORTLSTM_BLAS_BACKEND='openblass'" in out["query"]
    expected = "ORTLSTM_BLAS_BACKEND='openblass' is not a BLAS backend: expected mkl, openblas or openblas+mkl"
    assert expected in out["register"]


def test_backend_is_fixed_per_process():
    linked = _linked()
    if len(linked) < 2:
        pytest.skip(f"one backend linked: {_build_line()}")
    out = _run_child(
        """
        run_lstm()
        first = ortlstm.ops.blas_backend()
        other = "mkl" if first != "mkl" else "openblas"
        os.environ["ORTLSTM_BLAS_BACKEND"] = other
        try:
            run_lstm()
            error = ""
        except Exception as caught:
            error = str(caught)
        os.environ["ORTLSTM_BLAS_BACKEND"] = first
        run_lstm()
        print(json.dumps({"first": first, "error": error, "still": ortlstm.ops.blas_backend()}))
        """,
        None,
    )
    assert "already runs ortlstm on " + out["first"] in out["error"]
    assert out["still"] == out["first"]
