"""fit's learning-rate schedules, one class per kind, against torch.optim.lr_scheduler's recorded rates.

tests/recordings/schedules.json (record_schedules.py, with torch) holds, per case, the scheduler
torch ran, the ``Schedule`` fields that describe it and its first learning rates. torch steps
CosineAnnealingLR by its recursive form; the closed forms here agree to float64 rounding.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import numpy as np
import pytest

from ortlstm import fit as fitting
from ortlstm.fit import schedule as schedules

RECORDING = pathlib.Path(__file__).resolve().parent / "recordings" / "schedules.json"
CASES: list[dict[str, Any]] = json.loads(RECORDING.read_text())["cases"]
TORCH_RTOL = 1e-12
"""The closed forms vs torch's recursive updates of the same float64 rate: a few roundings."""


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_schedules_match_torchs_recorded_rates(case: dict[str, Any]) -> None:
    schedule = fitting.Schedule(lr=case["lr"], **case["schedule"])
    assert type(schedule) is schedules.Schedule.KINDS[case["schedule"]["kind"]]
    rates = [schedule(n) for n in range(len(case["lrs"]))]
    np.testing.assert_allclose(rates, case["lrs"], rtol=TORCH_RTOL, atol=0.0, err_msg=case["torch"])


def test_every_schedule_has_its_class_and_a_torch_recording() -> None:
    assert fitting.SCHEDULES == ("constant", "step", "cosine", "linear-warmup")
    recorded = {case["schedule"]["kind"] for case in CASES}
    for kind in fitting.SCHEDULES:
        cls = schedules.Schedule.KINDS[kind]
        assert cls is not schedules.Schedule
        assert kind == cls.KIND
        assert "torch" in (cls.__doc__ or "") and "lr" in (cls.__doc__ or ""), f"{kind}: torch's closed form"
        assert kind in recorded, f"{kind}: record torch's rates in tests/recordings/record_schedules.py"


def test_the_json_of_a_checkpoint_is_unchanged() -> None:
    """The fields and values fit saves with a checkpoint (and compares on resume) are the ones saved before."""
    cosine = fitting.Schedule.from_options(0.1, {"kind": "cosine", "eta_min": 0.01}, unit="epoch").bound(5, 3)
    assert cosine.to_json() == {
        "kind": "cosine",
        "lr": 0.1,
        "unit": "epoch",
        "steps_per_epoch": 5,
        "total": 3,
        "step_size": None,
        "gamma": 0.1,
        "t_max": None,
        "eta_min": 0.01,
        "warmup": 0,
        "start_factor": 1.0 / 3.0,
    }
    step = fitting.Schedule.from_options(0.5, "step", step_size=2).bound(4, 10)
    saved = step.to_json()
    assert "total" not in saved  # its values do not depend on the run's length: a run may be resumed longer
    assert fitting.Schedule(**saved) == dataclasses.replace(step, total=None)
    assert fitting.Schedule(**cosine.to_json()) == cosine


def test_a_kind_is_its_class_and_the_class_its_kind() -> None:
    assert isinstance(fitting.Schedule("step", 0.1, step_size=1), schedules.StepSchedule)
    assert isinstance(fitting.Schedule(kind="cosine", lr=0.1, total=3), schedules.CosineSchedule)
    assert fitting.Schedule("constant", 0.1) == schedules.ConstantSchedule("constant", 0.1)
    with pytest.raises(ValueError, match="--schedule: expected one of constant, step, cosine, linear-warmup, got 'ex"):
        fitting.Schedule("exp", 0.1)
    with pytest.raises(ValueError, match="StepSchedule is the schedule 'step', got kind='cosine'"):
        schedules.StepSchedule("cosine", 0.1)
    with pytest.raises(ValueError, match=r"--start-factor must be in \(0, 1\] \(torch's LinearLR\), got 0.0"):
        fitting.Schedule("linear-warmup", 0.1, start_factor=0.0)
    with pytest.raises(ValueError, match=r"--schedule cosine: needs 0 <= --warmup \(5\) < T_max \(5 scheduler"):
        fitting.Schedule("cosine", 0.1, total=5, warmup=5)
