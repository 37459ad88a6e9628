"""Records torch.optim.lr_scheduler's learning rates for each of fit's schedules (``ortlstm.fit.Schedule``).

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_schedules.py

It rewrites ``schedules.json`` next to this file, which ``tests/test_schedules.py`` reads without
torch: per case, the scheduler torch ran (its text), the ``Schedule`` fields that describe it, and
the learning rate of each of its first ``steps`` optimizer steps (read from the param group
before the step, then ``scheduler.step()``, as a training loop does), in float64.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import torch

lr_scheduler = torch.optim.lr_scheduler

Make = Callable[[torch.optim.Optimizer], Any]

# (name, the scheduler, its text, base lr, Schedule's fields, steps)
CASES: list[tuple[str, Make | None, str, float, dict[str, Any], int]] = [
    ("constant", None, "no scheduler", 0.3, {"kind": "constant"}, 6),
    ("constant_lr", lambda o: lr_scheduler.ConstantLR(o, factor=1.0), "ConstantLR(factor=1.0)", 0.05,
     {"kind": "constant"}, 6),
    ("step", lambda o: lr_scheduler.StepLR(o, step_size=3, gamma=0.5), "StepLR(step_size=3, gamma=0.5)", 0.1,
     {"kind": "step", "step_size": 3, "gamma": 0.5}, 12),
    ("step_default_gamma", lambda o: lr_scheduler.StepLR(o, step_size=2), "StepLR(step_size=2)", 1.0,
     {"kind": "step", "step_size": 2}, 9),
    ("cosine", lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=10, eta_min=0.001),
     "CosineAnnealingLR(T_max=10, eta_min=0.001)", 0.1, {"kind": "cosine", "total": 10, "eta_min": 0.001}, 11),
    ("cosine_t_max", lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=7), "CosineAnnealingLR(T_max=7)", 0.02,
     {"kind": "cosine", "t_max": 7, "total": 20}, 8),
    (
        "linear_warmup",
        lambda o: lr_scheduler.SequentialLR(
            o,
            [lr_scheduler.LinearLR(o, start_factor=0.2, total_iters=3), lr_scheduler.CosineAnnealingLR(o, T_max=7)],
            milestones=[3],
        ),
        "SequentialLR([LinearLR(start_factor=0.2, total_iters=3), CosineAnnealingLR(T_max=7)], milestones=[3])",
        0.1,
        {"kind": "linear-warmup", "total": 10, "warmup": 3, "start_factor": 0.2},
        10,
    ),
    (
        "linear_warmup_default_factor",
        lambda o: lr_scheduler.SequentialLR(
            o,
            [
                lr_scheduler.LinearLR(o, total_iters=4),
                lr_scheduler.CosineAnnealingLR(o, T_max=12 - 4, eta_min=0.01),
            ],
            milestones=[4],
        ),
        "SequentialLR([LinearLR(total_iters=4), CosineAnnealingLR(T_max=8, eta_min=0.01)], milestones=[4])",
        0.5,
        {"kind": "linear-warmup", "total": 12, "warmup": 4, "eta_min": 0.01},
        12,
    ),
]


def record(make: Make | None, lr: float, steps: int) -> list[float]:
    parameter = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    optimizer = torch.optim.SGD([parameter], lr=lr)
    scheduler = make(optimizer) if make is not None else None
    values = []
    for _ in range(steps):
        values.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return values


def main() -> None:
    cases = [
        {"name": name, "torch": text, "lr": lr, "schedule": fields, "lrs": record(make, lr, steps)}
        for name, make, text, lr, fields, steps in CASES
    ]
    path = pathlib.Path(__file__).resolve().parent / "schedules.json"
    path.write_text(json.dumps({"torch": torch.__version__, "cases": cases}, indent=1) + "\n")
    print(f"wrote {path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
