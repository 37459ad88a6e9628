"""The bf16 GEMM layer (kernels_cpp/common/bf16_gemm.h) against NumPy oracles.

Rounding: bit for bit against an RNE reference computed from the float32 values in float64 (the
two bfloat16 neighbours of each value, the nearer one, ties to the even one), over ties, NaN,
infinities, overflow and denormals. GEMMs: against float64 products of the NumPy-rounded operands,
within the float32 accumulation bound K * 2^-24 * sum|a||b| (the products are exact), on every
transpose and entry point; the fallback backend (ORTLSTM_BF16_GEMM=fallback, in a child process:
the choice is per process) against this process's backend within the same bound.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import bf16_probe
import numpy as np
import pytest
from test_blas_backend import _build_line

import ortlstm.ops

TESTS = str(Path(__file__).resolve().parent)


def _bf16_value(bits: int) -> float:
    """The value of bfloat16 bits as float64; the infinities as +-2^128, where RNE puts them when rounding."""
    if bits & 0x7FFF == 0x7F80:
        return -(2.0**128) if bits & 0x8000 else 2.0**128
    return float(np.array([bits << 16], np.uint32).view(np.float32)[0])


def _reference_round(values: np.ndarray) -> np.ndarray:
    """RNE to bfloat16 from the values (not the bit trick): the nearer neighbour, ties to even mantissa."""
    x = np.asarray(values, np.float32).ravel()
    bits = x.view(np.uint32)
    x64 = np.where(np.isnan(x), 0.0, x).astype(np.float64)
    out = np.empty(x.shape, np.uint16)
    for i, (value, word) in enumerate(zip(x64, bits, strict=True)):
        if np.isnan(x[i]):
            out[i] = (word >> 16) | 0x40
            continue
        if np.isinf(value):
            out[i] = word >> 16
            continue
        down = int(word >> 16)  # toward zero
        up = down + 1  # away from zero; past the largest finite it is inf, i.e. +-2^128 with an unbounded exponent
        gap_down = abs(value - _bf16_value(down))
        gap_up = abs(_bf16_value(up) - value)
        if gap_down < gap_up or (gap_down == gap_up and down % 2 == 0):
            out[i] = down
        else:
            out[i] = up
    return out.reshape(np.shape(values))


def _rounded(values: np.ndarray) -> np.ndarray:
    """The bfloat16 values of the reference rounding, as float64."""
    bits = _reference_round(values).astype(np.uint32) << 16
    return bits.view(np.float32).astype(np.float64)


def test_rounding_matches_the_rne_reference_bit_for_bit():
    tiny = np.finfo(np.float32).tiny
    special = np.array(
        [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, np.finfo(np.float32).max,
         -np.finfo(np.float32).max, tiny, -tiny, tiny / 3, 1e-45, -1e-45, 3.0e38, 1.0 + 2**-8, 1.0 + 3 * 2**-8,
         1.0 + 2**-8 + 2**-20, 1.0 + 2**-9],
        np.float32,
    )
    # Exact ties (low half 0x8000) with even and odd kept bits, and their neighbours.
    ties = (np.array([0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x00018000, 0x00008000, 0x7F7F8000,
                      0xFF7F8000], np.uint32)).view(np.float32)
    # Signalling NaN whose payload lies in the low half only: must stay NaN.
    nans = np.array([0x7F800001, 0xFF800001, 0x7FC00000], np.uint32).view(np.float32)
    rng = np.random.default_rng(0)
    random = rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate([special, ties, nans, random])
    got = bf16_probe.round_bits(values)
    np.testing.assert_array_equal(got, _reference_round(values))
    assert np.isnan(((got[-2000 - 3 : -2000].astype(np.uint32)) << 16).view(np.float32)).all()


def _oracle(a: np.ndarray, b: np.ndarray, c: np.ndarray, trans_a: bool, trans_b: bool, alpha: float, beta: float):
    """float64 product of the rounded operands and the float32 accumulation bound of each element."""
    ra, rb = _rounded(a), _rounded(b)
    ra, rb = (ra.T if trans_a else ra), (rb.T if trans_b else rb)
    exact = alpha * (ra @ rb) + beta * c.astype(np.float64)
    k = ra.shape[1]
    bound = (k + 2) * 2.0**-24 * (abs(alpha) * (np.abs(ra) @ np.abs(rb)) + abs(beta) * np.abs(c)) + 1e-30
    return exact, bound


@pytest.mark.parametrize("mode", ["rounded", "bf16", "operand", "parallel"])
@pytest.mark.parametrize(("trans_a", "trans_b"), [(False, False), (False, True), (True, False), (True, True)])
def test_gemm_matches_float64_on_rounded_operands(mode, trans_a, trans_b):
    if mode == "operand" and trans_a:
        pytest.skip("the operand object is a right operand: A is never transposed")
    rng = np.random.default_rng(1)
    m, n, k = (301, 29, 1024) if mode == "parallel" else (37, 29, 301)  # parallel: enough work for 3 blocks
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    c = rng.standard_normal((m, n)).astype(np.float32)
    got = bf16_probe.gemm(mode, a, b, c, trans_a, trans_b, alpha=0.75, beta=0.5)
    exact, bound = _oracle(a, b, c, trans_a, trans_b, 0.75, 0.5)
    error = np.abs(got - exact)
    assert (error <= bound).all(), f"worst error/bound {np.max(error / bound):.3g}"
    # bf16 really happened: float32 operands give a different result, well outside the bound.
    float32 = a.astype(np.float64)
    assert not np.allclose(got, 0.75 * ((float32.T if trans_a else float32) @ (b.T if trans_b else b)) + 0.5 * c,
                           rtol=0, atol=float(bound.max()))


def test_gemm_empty_and_k_zero():
    c = np.full((3, 4), 2.0, np.float32)
    got = bf16_probe.gemm("rounded", np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32), c, False, False,
                          beta=0.5)
    np.testing.assert_array_equal(got, np.full((3, 4), 1.0, np.float32))


@pytest.mark.parametrize("mode", ["operand", "operand_steps"])
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
def test_operand_into_a_strided_c(mode, beta):
    """A step GEMM into a task's block of a wider gates row (blocks of hidden units: ldc > N).

    oneDNN multiplies it into dense scratch that is then added (Bf16Operand::Multiply): columns
    [0, N) get beta * C + the product (beta 0 ignores C's values, NaN included), the rest stay.
    """
    rng = np.random.default_rng(3)
    m, n, k = 16, 96, 200
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32)
    c = rng.standard_normal((m, n + 40)).astype(np.float32)
    if beta == 0.0:
        c[:, :n] = np.nan
    got = bf16_probe.gemm(mode, a, b, c, False, True, beta=beta)
    exact, bound = _oracle(a, b, np.nan_to_num(c[:, :n]) if beta == 0.0 else c[:, :n], False, True, 1.0, beta)
    error = np.abs(got[:, :n] - exact)
    assert (error <= bound).all(), f"worst error/bound {np.max(error / bound):.3g}"
    np.testing.assert_array_equal(got[:, n:], c[:, n:])


@pytest.mark.parametrize(("trans_a", "trans_b"), [(False, False), (True, False), (False, True)])
def test_a_reused_left_operand_is_the_first_calls_rounding(trans_a, trans_b):
    """Bf16ReuseLeftOperand: a second big GEMM on the same A reuses the first one's bfloat16 copy.

    The probe doubles A between the two calls (breaking the caller's promise, to see the reuse): with
    oneDNN or oneMKL the product is that of A as given; the fallback rounds every call (2A).
    """
    rng = np.random.default_rng(4)
    m, n, k = 301, 29, 1024  # enough work for three blocks
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    c = rng.standard_normal((m, n)).astype(np.float32)
    got = bf16_probe.gemm("parallel_reused_left", a, b, c, trans_a, trans_b, alpha=0.75, beta=0.5)
    reused = ortlstm.ops.bf16_gemm_backend() != "fallback"
    exact, bound = _oracle(a if reused else 2 * a, b, c, trans_a, trans_b, 0.75, 0.5)
    error = np.abs(got - exact)
    assert (error <= bound).all(), f"worst error/bound {np.max(error / bound):.3g}"


@functools.cache  # one child per (code, backend): the processes dominate this file's time
def _child(code: str, backend: str | None) -> dict:
    env = dict(os.environ)
    env.pop("ORTLSTM_BF16_GEMM", None)
    if backend is not None:
        env["ORTLSTM_BF16_GEMM"] = backend
    prelude = f"import json, sys\nsys.path.insert(0, {TESTS!r})\nimport numpy as np\nimport bf16_probe, ortlstm.ops\n"
    result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                            env=env, cwd=Path(TESTS).anchor, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    out["stderr"] = result.stderr
    return out


_GEMM_CODE = """
rng = np.random.default_rng(2)
a = rng.standard_normal((64, 512)).astype(np.float32)
b = rng.standard_normal((256, 512)).astype(np.float32)
c = np.zeros((64, 256), np.float32)
got = {mode: bf16_probe.gemm(mode, a, b, c, False, True).tolist() for mode in ("rounded", "operand", "parallel")}
print(json.dumps({"backend": ortlstm.ops.bf16_gemm_backend(), **got}))
"""


def test_each_backend_matches_float64_and_the_fallback_equals_mkl_within_summation_rounding():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((64, 512)).astype(np.float32), rng.standard_normal((256, 512)).astype(np.float32)
    exact, bound = _oracle(a, b, np.zeros((64, 256), np.float32), False, True, 1.0, 0.0)
    results = {}
    for backend in ("fallback", "mkl", "onednn"):
        if backend == "mkl" and "oneMKL" not in _build_line():
            continue
        results[backend] = _child(_GEMM_CODE, backend)
        if backend == "onednn" and results[backend]["backend"] == "fallback":
            del results[backend]  # a build without oneDNN's headers, or libdnnl missing: test_bf16_onednn.py
            continue
        assert results[backend]["backend"] == backend
        for mode in ("rounded", "operand", "parallel"):  # operand: packed by oneMKL under mkl, oneDNN under onednn
            assert (np.abs(np.array(results[backend][mode]) - exact) <= bound).all(), (backend, mode)
    for backend in set(results) - {"fallback"}:
        for mode in ("rounded", "operand", "parallel"):
            gap = np.abs(np.array(results["fallback"][mode]) - np.array(results[backend][mode]))
            assert (gap <= 2 * bound).all(), (backend, mode)


def test_fallback_warns_once_saying_why():
    forced = _child(_GEMM_CODE, "fallback")["stderr"]
    assert forced.count("ortlstm: warning") == 1, forced
    assert 'matmul_precision="bfloat16" runs on the fallback GEMM (ORTLSTM_BF16_GEMM=fallback)' in forced
    assert "the same numbers but slower than matmul_precision=\"float32\"" in forced
    automatic = _child(_GEMM_CODE, None)
    assert automatic["stderr"].count("ortlstm: warning") == (automatic["backend"] == "fallback")


def test_bad_backend_is_refused_clearly():
    out = _child(
        """
        try:
            ortlstm.ops.bf16_gemm_backend()
            error = ""
        except ValueError as caught:
            error = str(caught)
        print(json.dumps({"error": error}))
        """,
        "mkll",
    )
    assert (
        "ORTLSTM_BF16_GEMM='mkll': not a bf16 GEMM backend of this build of ortlstm (expected mkl, onednn or fallback"
        in out["error"]
    )


def test_backend_in_this_process():
    forced = os.environ.get("ORTLSTM_BF16_GEMM")
    assert ortlstm.ops.bf16_gemm_backend() == (forced or ortlstm.ops.bf16_gemm_backend())
    assert ortlstm.ops.bf16_gemm_backend() in ("mkl", "onednn", "fallback")
