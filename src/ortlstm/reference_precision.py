"""The ``matmul_precision`` of the recurrent references (issue 33): their GEMMs as the kernels run them.

``"float32"`` (the default): a plain product, in the references' float64. ``"bfloat16"``: both operands
rounded to bfloat16 first (round to nearest even, as common/bf16_gemm.h rounds them), the products and
sums in float64, so the kernels' bf16 ops match these references up to their float32 accumulation.
Rounding is element by element, so it does not matter how a GEMM is cut (the references multiply one
step at a time, the kernels all steps at once).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

_Array = np.ndarray

PRECISIONS = ("float32", "bfloat16")
"""The values of the ``matmul_precision`` attribute, as the kernels accept them."""


def parse_matmul_precision(values: Mapping[str, Any]) -> str:
    """The node's ``matmul_precision`` (decoded attribute values), checked with the kernels' wording.

    Raises:
        ValueError: For a value other than float32 or bfloat16.
    """
    precision = values.get("matmul_precision", "float32")
    if precision not in PRECISIONS:
        raise ValueError(f"attribute matmul_precision: expected float32 or bfloat16, got '{precision}'")
    return str(precision)


def round_to_bfloat16(x: _Array) -> _Array:
    """``x`` as float32, rounded to bfloat16 (nearest, ties to even), returned as float64 (exact)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32).astype(np.float64)


def matmul(precision: str, a: _Array, b: _Array) -> _Array:
    """``a @ b`` with the operands rounded to bfloat16 when ``precision`` is ``"bfloat16"``."""
    if precision == "bfloat16":
        return round_to_bfloat16(a) @ round_to_bfloat16(b)
    return np.asarray(a @ b)
