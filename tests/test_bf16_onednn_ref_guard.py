"""oneDNN's reference matmul never runs a large bf16 GEMM of the recurrent ops (issue 33).

kernels_cpp/common/bf16_onednn.cc MakeMatmul refuses a primitive whose implementation is oneDNN's
reference one ("ref:any") from kRefLimit (2^21) multiply-adds: ref is what oneDNN falls back to when
no optimized kernel takes the layouts (packed weights with a strided C: the step GEMMs of layout 1),
and it is ~1000x slower than its brgemm (one 32 x 256 x 1024 step GEMM: ~0.8 s instead of ~1 ms).
The refusal sends the caller to the plain-layout path or the fallback GEMM, with the same numbers.

The oracle is oneDNN itself: with ONEDNN_VERBOSE=1 it prints one line per executed primitive to
stdout, naming the implementation and the problem (``MxK:KxN``). A child process with
ORTLSTM_BF16_GEMM=onednn runs bf16 LSTMTraining + LSTMGrad at M's batch and widths (N 32, I 256,
H 256; 8 steps, enough for every GEMM kind) in layout 0 forward and layout 1 bidirectional; the test
reads the lines as they come and stops the child at the first large ref:any (without the guard the
layout-1 run would take ~13 s more per 16 such steps). Checked: with the guard removed (the kRefLimit
condition made always true), the layout 1 case fails here with 32x256:256x1024 on ref:any.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)
REF_LIMIT = 1 << 21  # kRefLimit in kernels_cpp/common/bf16_onednn.cc
_PROBLEM = re.compile(r"^(\d+(?:x\d+)*):(\d+(?:x\d+)*)$")  # a matmul's problem: src dims ":" weights dims

_CHILD = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
import op_runner
import ortlstm.ops

print("backend", ortlstm.ops.bf16_gemm_backend(), flush=True)
attributes = {{"hidden_size": 256, "matmul_precision": "bfloat16", **{attributes!r}}}
T, N, I, H = 8, 32, 256, 256
D = 2 if attributes.get("direction") == "bidirectional" else 1
rng = np.random.default_rng(0)
bound = 1 / np.sqrt(H)
inputs = {{
    "X": rng.standard_normal((N, T, I) if attributes.get("layout") else (T, N, I)).astype(np.float32),
    "W": rng.uniform(-bound, bound, (D, 4 * H, I)).astype(np.float32),
    "R": rng.uniform(-bound, bound, (D, 4 * H, H)).astype(np.float32),
    "B": rng.uniform(-bound, bound, (D, 8 * H)).astype(np.float32),
}}
forward = op_runner.run("LSTMTraining", inputs, attributes, dtype=np.float32,
                        outputs=("HAll", "Ht", "Ct", "CAll", "IOFC"), threads=2)
grads = {{**inputs, **forward, "grad_HAll": rng.standard_normal(forward["HAll"].shape).astype(np.float32)}}
op_runner.run("LSTMGrad", grads, attributes, dtype=np.float32, outputs=("dX", "dW", "dR", "dB"), threads=2)
print("done", flush=True)
"""


def _cpu_has_bf16_units() -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _matmul_exec(line: str) -> tuple[str, str, int] | None:
    """(implementation, problem, multiply-adds) of a verbose line of an executed matmul, else None.

    oneDNN 3.x: ``onednn_verbose,[v1,][timestamp,]exec,cpu,matmul,IMPLEMENTATION,...,PROBLEM,TIME`` (fields
    before ``exec`` vary with the version and the verbose options; the problem is the second-last field).
    """
    fields = line.strip().split(",")
    if not fields or not fields[0].startswith(("onednn_verbose", "dnnl_verbose")) or "exec" not in fields:
        return None
    at = fields.index("exec")
    if len(fields) < at + 5 or fields[at + 2] != "matmul":
        return None
    match = _PROBLEM.match(fields[-2])
    if match is None:
        return None
    src = [int(d) for d in match.group(1).split("x")]
    weights = [int(d) for d in match.group(2).split("x")]
    return fields[at + 3], fields[-2], math.prod(src) * weights[-1]


def _run_child(attributes: dict[str, object]) -> tuple[str, list[tuple[str, str, int]], str]:
    """The child's backend, its executed matmuls (stopped at the first large ref:any), and its stderr."""
    env = {**os.environ, "ORTLSTM_BF16_GEMM": "onednn", "ONEDNN_VERBOSE": "1", "DNNL_VERBOSE": "1"}
    code = textwrap.dedent(_CHILD.format(tests=TESTS, attributes=attributes))
    backend, executed = "", []
    with subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(TESTS).anchor,
    ) as child:
        assert child.stdout is not None and child.stderr is not None
        for line in child.stdout:
            if line.startswith("backend "):
                backend = line.split()[1]
            matmul = _matmul_exec(line)
            if matmul is not None:
                executed.append(matmul)
                if matmul[0].startswith("ref") and matmul[2] >= REF_LIMIT:
                    child.kill()  # the rest would take seconds per step; one is the finding
                    break
        stderr = child.stderr.read()
        returncode = child.wait(timeout=300)
    if returncode != 0 and not (executed and executed[-1][0].startswith("ref")):
        pytest.fail(f"the child failed (exit {returncode}):\n{stderr}")
    return backend, executed, stderr


@pytest.mark.parametrize(
    "attributes",
    [{}, {"layout": 1, "direction": "bidirectional"}],
    ids=["layout0-forward", "layout1-bidirectional"],
)
def test_no_large_gemm_runs_on_onednn_reference_matmul(attributes: dict[str, object]) -> None:
    if not _cpu_has_bf16_units():
        pytest.skip(
            "this CPU has no bf16 units (avx512_bf16 or amx_bf16 in /proc/cpuinfo): oneDNN's bf16 matmul "
            "is not the backend a user gets here, and its kernels differ"
        )
    backend, executed, stderr = _run_child(attributes)
    if backend != "onednn":
        pytest.skip(f"oneDNN does not load here (ORTLSTM_BF16_GEMM=onednn gave {backend!r}): {stderr.strip()}")
    large = [matmul for matmul in executed if matmul[2] >= REF_LIMIT]
    assert large, f"no matmul of >= {REF_LIMIT} multiply-adds executed in oneDNN (verbose output missing?)"
    on_ref = sorted(
        {f"{problem} on {implementation}" for implementation, problem, _ in large if implementation.startswith("ref")}
    )
    assert not on_ref, f"oneDNN's reference matmul ran GEMMs of >= {REF_LIMIT} multiply-adds: {on_ref}"
    assert "warning" not in stderr, stderr
