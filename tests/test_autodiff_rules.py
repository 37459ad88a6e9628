"""Every gradient rule against central finite differences (float64) and in float32, in onnxruntime.

One table of cases; each rule has at least one row. See tests/gradcheck.py for the method.
"""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import Case, check_case, check_case_float32, wrt

_RNG = np.random.default_rng(7)


def _r(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape)


CASES = [
    Case("Add_broadcast", "Add", (wrt(_r(2, 3, 4)), wrt(_r(3, 1)))),
    Case("Add_broadcast_dynamic", "Add", (wrt(_r(2, 3, 4), dynamic=True), wrt(_r(1, 4), dynamic=True))),
    Case("Mul_scalar", "Mul", (wrt(_r(2, 3)), wrt(_r()))),
    Case("Mul_same_input_twice", "Mul", (wrt(_r(3, 2)),) * 2),
    Case("Tanh", "Tanh", (wrt(_r(2, 5)),)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_rule_matches_finite_differences(case: Case) -> None:
    check_case(case)


@pytest.mark.parametrize("optimize", [False, True], ids=["opt_off", "opt_on"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_rule_float32(case: Case, optimize: bool) -> None:
    check_case_float32(case, optimize)
