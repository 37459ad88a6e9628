"""The bf16 GEMM layer of the kernel library through ctypes (kernels_cpp/common/bf16_probe.cc), for tests."""

from __future__ import annotations

import ctypes

import numpy as np

import ortlstm.ops

MODES = {"rounded": 0, "bf16": 1, "operand": 2, "float32": 3, "parallel": 4, "operand_steps": 5,
         "operand_fewer_rows": 6, "parallel_reused_left": 7}


def _library() -> ctypes.CDLL:
    ortlstm.ops.bf16_gemm_backend()  # loads the BLAS the library needs first
    return ctypes.CDLL(ortlstm.ops.library_path())


def round_bits(values: np.ndarray) -> np.ndarray:
    """The library's float32 -> bfloat16 rounding: the uint16 bits."""
    src = np.ascontiguousarray(values, dtype=np.float32)
    dst = np.empty(src.shape, np.uint16)
    function = _library().OrtLstmRoundToBfloat16
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    function(src.ctypes.data, dst.ctypes.data, src.size)
    return dst


def gemm(mode: str, a: np.ndarray, b: np.ndarray, c: np.ndarray, trans_a: bool, trans_b: bool, alpha: float = 1.0,
         beta: float = 0.0) -> np.ndarray:
    """C = alpha * op(A) op(B) + beta * C through the layer's entry point ``mode`` (MODES); returns a new C.

    ``"bf16"`` rounds A and B with the library first and hands it the bits.
    """
    a = np.ascontiguousarray(a, np.float32)
    b = np.ascontiguousarray(b, np.float32)
    if mode == "bf16":  # the GEMM takes the bits
        a, b = round_bits(a), round_bits(b)
    out = np.array(c, np.float32, copy=True, order="C")
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    n = b.shape[0] if trans_b else b.shape[1]  # C may be wider (a strided C: its columns past n stay)
    function = _library().OrtLstmGemmBf16
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, *[ctypes.c_int64] * 3, ctypes.c_float,
                         ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float,
                         ctypes.c_void_p, ctypes.c_int64]
    status = function(MODES[mode], int(trans_a), int(trans_b), m, n, k, alpha, a.ctypes.data, a.shape[1],
                      b.ctypes.data, b.shape[1], beta, out.ctypes.data, out.shape[1])
    assert status == 0, f"OrtLstmGemmBf16 refused mode {mode} with trans_a={trans_a}"
    return out
