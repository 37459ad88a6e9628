"""The conformance cases in tests/conformance/data/node: valid models, passed by every runtime, no drift.

The cases are generated from ``ortlstm.reference`` (``python -m ortlstm.conformance generate``).
Every case must pass on onnxruntime with the kernel library and on onnx's ReferenceEvaluator with
``ortlstm.reference.OPS``; every model must pass onnx's full check and shape inference; and the
checked-in data must be what the generator writes today.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.backend.base
import onnx.checker
import onnx.shape_inference
import pytest

from ortlstm import conformance

DATA = Path(__file__).resolve().parent / "conformance" / "data" / "node"
CASES = conformance.load_cases(DATA)
DRIFT_RTOL = {"float32": 1e-6, "float64": 1e-12}


def _case_id(case: conformance.Case) -> str:
    return case.name


def test_every_spec_is_checked_in_in_both_dtypes() -> None:
    expected = {conformance.case_name(spec, dtype) for spec in conformance.SPECS for dtype in ("float32", "float64")}
    assert {case.name for case in CASES} == expected


@pytest.mark.parametrize("backend", ["onnxruntime", "reference"])
def test_every_case_passes(backend: str) -> None:
    """One run per backend; the failure lists every case that failed and what differed."""
    results = conformance.run(backend, DATA)
    failed = [f"{result.name}: {result.message}" for result in results if not result.passed]
    assert not failed, f"{len(failed)} of {len(results)} cases fail on {backend}:\n" + "\n".join(failed)
    assert len(results) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_model_passes_checker_and_shape_inference(case: conformance.Case) -> None:
    """Full check, strict shape inference, and the inferred output shapes are the declared ones."""
    onnx.checker.check_model(case.model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(case.model, check_type=True, strict_mode=True, data_prop=True)
    known = {value.name: value.type for value in (*inferred.graph.value_info, *inferred.graph.output)}
    for output, expected in zip(case.model.graph.output, case.outputs, strict=True):
        dims = [dim.dim_value for dim in known[output.name].tensor_type.shape.dim]
        assert dims == list(expected.shape), f"{case.name}: {output.name}"


def test_generator_output_matches_checked_in_data(tmp_path: Path) -> None:
    """Regenerates every case: models and inputs identical, outputs equal up to rounding."""
    conformance.generate(tmp_path)
    fresh = {case.name: case for case in conformance.load_cases(tmp_path)}
    assert set(fresh) == {case.name for case in CASES}, "regenerate: python -m ortlstm.conformance generate " + str(
        DATA
    )
    for case in CASES:
        new = fresh[case.name]
        hint = f"{case.name} drifted from the generator; regenerate with python -m ortlstm.conformance generate {DATA}"
        assert new.model.SerializeToString() == case.model.SerializeToString(), hint
        for old_value, new_value in zip(case.inputs, new.inputs, strict=True):
            np.testing.assert_array_equal(new_value, old_value, err_msg=hint)
        assert len(new.outputs) == len(case.outputs), hint
        for old_value, new_value in zip(case.outputs, new.outputs, strict=True):
            assert new_value.dtype == old_value.dtype, hint
            rtol = DRIFT_RTOL[old_value.dtype.name]
            np.testing.assert_allclose(new_value, old_value, rtol=rtol, atol=rtol, err_msg=hint)


class _PluggedBackend(onnx.backend.base.Backend):
    """A user's backend: here the reference again, reached only through onnx's Backend interface."""

    prepared = 0

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: object) -> onnx.backend.base.BackendRep:
        cls.prepared += 1
        return conformance.ReferenceBackend.prepare(model, device)


class _WrongBackend(onnx.backend.base.Backend):
    """Returns the reference's outputs scaled by 1.01: the runner must catch it."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: object) -> onnx.backend.base.BackendRep:
        rep = conformance.ReferenceBackend.prepare(model, device)

        class _Scaled(onnx.backend.base.BackendRep):
            def run(self, inputs: object, **run_kwargs: object) -> tuple[np.ndarray, ...]:
                return tuple(np.asarray(value) * np.asarray(1.01, value.dtype) for value in rep.run(inputs))

        return _Scaled()


def test_runner_takes_any_onnx_backend() -> None:
    results = conformance.run(_PluggedBackend, DATA)
    assert all(result.passed for result in results)
    assert _PluggedBackend.prepared == len(CASES)


def test_runner_reports_a_wrong_backend() -> None:
    results = conformance.run(_WrongBackend, DATA)
    assert not any(result.passed for result in results)
    assert all("Not equal to tolerance" in result.message for result in results)


def test_command_line_runs_a_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert conformance.main(["run", str(DATA), "--backend", "reference"]) == 0
    assert f"{len(CASES)} of {len(CASES)} cases passed on reference" in capsys.readouterr().out
