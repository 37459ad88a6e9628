"""Learning-rate schedules of ``ortlstm fit``: torch.optim.lr_scheduler's closed forms, as ``lr(n)``.

``Schedule(kind, lr, ...)`` is the schedule of that kind: one class per kind (``ConstantSchedule``,
``StepSchedule``, ``CosineSchedule``, ``LinearWarmupSchedule``), each with its own checks and its
torch closed form, registered by ``kind`` (``SCHEDULES`` lists them). Every kind holds the same
fields, so ``to_json`` (the checkpoint's config) and ``from_options`` are one format for all; a new
kind is one subclass here (its ``kind=`` and ``_lr``) plus its test against torch's scheduler.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, ClassVar

SCHEDULE_UNITS = ("update", "epoch")

@dataclasses.dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule as torch.optim.lr_scheduler computes it, as ``lr(n)`` for the Trainer.

    ``Schedule(kind, lr, ...)`` makes the subclass registered for ``kind`` (its docstring gives
    torch's closed form). ``n`` counts the scheduler's steps done: with ``unit="update"`` (the
    default) the scheduler is stepped after every optimizer update, as the Hugging Face Trainer
    does; with ``unit="epoch"`` after every epoch, as torch's examples do (``n`` is then
    ``updates_done // steps_per_epoch``).

    Attributes:
        kind: One of ``SCHEDULES``.
        lr: The base learning rate (torch's ``base_lr``).
        unit: ``"update"`` or ``"epoch"``: when the scheduler steps.
        steps_per_epoch: Updates per epoch (to count epochs with ``unit="epoch"``).
        total: The run's scheduler steps (updates, or epochs): cosine's default ``T_max``
            (``bound`` fills it and ``steps_per_epoch`` in from the run).
        step_size: StepLR's period, in scheduler steps.
        gamma: StepLR's decay factor (torch's default 0.1).
        t_max: CosineAnnealingLR's ``T_max`` (default: ``total``).
        eta_min: The cosine's minimum (torch's default 0).
        warmup: Scheduler steps of linear warmup.
        start_factor: LinearLR's start factor (torch's default 1/3).
    """

    kind: str
    lr: float
    unit: str = "update"
    steps_per_epoch: int | None = None
    total: int | None = None
    step_size: int | None = None
    gamma: float = 0.1
    t_max: int | None = None
    eta_min: float = 0.0
    warmup: int = 0
    start_factor: float = 1.0 / 3.0

    KINDS: ClassVar[dict[str, type[Schedule]]] = {}
    """kind -> its class, in registration order (``SCHEDULES``)."""
    KIND: ClassVar[str] = ""
    """The subclass's kind."""
    LENGTH_DEPENDENT: ClassVar[bool] = True
    """Whether its values depend on the run's length (``total``): then a resumed run must keep it."""

    def __init_subclass__(cls, *, kind: str, length_dependent: bool = True, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.KIND, cls.LENGTH_DEPENDENT = kind, length_dependent
        Schedule.KINDS[kind] = cls

    def __new__(cls, *args: Any, **kwargs: Any) -> Schedule:
        """The class of the kind given (first argument or ``kind=``): ``Schedule("step", ...)`` is a StepSchedule."""
        if cls is Schedule and (args or "kind" in kwargs):
            kind = args[0] if args else kwargs["kind"]
            if not isinstance(kind, str) or kind not in Schedule.KINDS:
                raise ValueError(f"--schedule: expected one of {', '.join(Schedule.KINDS)}, got {kind!r}")
            cls = Schedule.KINDS[kind]
        return object.__new__(cls)

    def __post_init__(self) -> None:
        if self.kind != self.KIND:
            raise ValueError(f"{type(self).__name__} is the schedule {self.KIND!r}, got kind={self.kind!r}")
        if self.unit not in SCHEDULE_UNITS:
            raise ValueError(f"--schedule-unit: expected one of {', '.join(SCHEDULE_UNITS)}, got {self.unit!r}")
        self._check()

    def _check(self) -> None:
        """Refuses this kind's fields that torch's scheduler refuses (or that could not give a value)."""

    def _lr(self, n: int) -> float:
        """torch's closed form at scheduler step ``n``."""
        raise NotImplementedError

    @classmethod
    def from_options(cls, lr: float, kind: str | Mapping[str, Any], **fields: Any) -> Schedule:
        """The schedule of fit's options: ``kind`` a name, or a JSON object of fields that override ``fields``.

        Raises:
            ValueError: An object without ``kind`` or with a field a schedule does not have.
        """
        if isinstance(kind, str):
            return cls(kind, lr, **fields)
        settable = [
            field.name for field in dataclasses.fields(cls) if field.name not in ("lr", "steps_per_epoch", "total")
        ]
        unknown = sorted(set(kind) - set(settable))
        if unknown or "kind" not in kind:
            raise ValueError(
                f"--schedule {json.dumps(kind)}: expected an object with kind ({', '.join(SCHEDULES)}) and any of "
                f"{', '.join(settable[1:])}; {'unknown: ' + ', '.join(unknown) if unknown else 'kind is missing'}"
            )
        return cls(lr=lr, **{**fields, **kind})

    def bound(self, steps_per_epoch: int, epochs: int) -> Schedule:
        """This schedule for a run of ``epochs`` epochs of ``steps_per_epoch`` updates (``total`` filled in)."""
        total = epochs * steps_per_epoch if self.unit == "update" else epochs
        return dataclasses.replace(self, steps_per_epoch=steps_per_epoch, total=total)

    @property
    def cosine_t_max(self) -> int:
        """The cosine's period: ``T_max``, less the warmup for ``linear-warmup``."""
        t_max = self.t_max if self.t_max is not None else self.total
        if t_max is None:
            raise ValueError("the schedule's length is unknown: give t_max, or bind it to a run (bound())")
        return t_max

    def __call__(self, updates_done: int) -> float:
        """The learning rate of the update that follows ``updates_done`` updates."""
        return self._lr(updates_done if self.unit == "update" else updates_done // (self.steps_per_epoch or 1))

    def to_json(self) -> dict[str, Any]:
        """The fields that decide its values (a resumed run must use the same).

        A constant or step schedule does not depend on the run's length, so a run may be resumed
        with more epochs; a cosine one does.
        """
        fields = dataclasses.asdict(self)
        if not self.LENGTH_DEPENDENT:
            del fields["total"]
        return fields

    def _cosine(self, n: int, t_max: int) -> float:
        """CosineAnnealingLR's closed form: ``eta_min + (lr - eta_min) * (1 + cos(pi * n / T_max)) / 2``."""
        return self.eta_min + (self.lr - self.eta_min) * (1.0 + math.cos(math.pi * n / t_max)) / 2.0

    def _check_warmup(self) -> None:
        t_max = self.t_max if self.t_max is not None else self.total
        if t_max is not None and not 0 <= self.warmup < t_max:
            raise ValueError(
                f"--schedule {self.kind}: needs 0 <= --warmup ({self.warmup}) < T_max ({t_max} scheduler steps)"
            )


@dataclasses.dataclass(frozen=True)
class ConstantSchedule(Schedule, kind="constant", length_dependent=False):
    """``constant``: ``lr`` at every step (torch: no scheduler, or ConstantLR with factor=1.0)."""

    def _lr(self, n: int) -> float:
        return self.lr


@dataclasses.dataclass(frozen=True)
class StepSchedule(Schedule, kind="step", length_dependent=False):
    """``step``, torch's StepLR(step_size, gamma): ``lr * gamma ** (n // step_size)``."""

    def _check(self) -> None:
        if self.step_size is None or self.step_size < 1:
            raise ValueError(f"--schedule step needs --step-size N (scheduler steps, >= 1), got {self.step_size}")

    def _lr(self, n: int) -> float:
        assert self.step_size is not None
        return self.lr * self.gamma ** (n // self.step_size)


@dataclasses.dataclass(frozen=True)
class CosineSchedule(Schedule, kind="cosine"):
    """``cosine``, torch's CosineAnnealingLR(T_max, eta_min), its documented closed form.

    ``eta_min + (lr - eta_min) * (1 + cos(pi * n / T_max)) / 2``, with ``T_max`` the run's total
    scheduler steps unless given.
    """

    def _check(self) -> None:
        self._check_warmup()

    def _lr(self, n: int) -> float:
        return self._cosine(n, self.cosine_t_max)


@dataclasses.dataclass(frozen=True)
class LinearWarmupSchedule(Schedule, kind="linear-warmup"):
    """``linear-warmup``: torch's SequentialLR of LinearLR then CosineAnnealingLR, milestone ``warmup``.

    LinearLR(start_factor, end_factor=1.0, total_iters=warmup), then CosineAnnealingLR(T_max -
    warmup, eta_min): ``lr * (start_factor + (1 - start_factor) * n / warmup)`` for ``n < warmup``,
    then the cosine at ``n - warmup`` over ``T_max - warmup``.
    """

    def _check(self) -> None:
        if not 0 < self.start_factor <= 1:
            raise ValueError(f"--start-factor must be in (0, 1] (torch's LinearLR), got {self.start_factor}")
        self._check_warmup()

    @property
    def cosine_t_max(self) -> int:
        """The cosine's period after the warmup: ``T_max - warmup``."""
        return super().cosine_t_max - self.warmup

    def _lr(self, n: int) -> float:
        if n < self.warmup:
            return self.lr * (self.start_factor + (1.0 - self.start_factor) * n / self.warmup)
        return self._cosine(n - self.warmup, self.cosine_t_max)


SCHEDULES: tuple[str, ...] = tuple(Schedule.KINDS)
"""Every schedule's kind, in registration order: constant, step, cosine, linear-warmup."""
