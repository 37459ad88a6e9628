"""Fit's checkpoint: the Trainer's, with fit's own state in its metadata, written atomically; resume."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ortlstm.fit.schedule import Schedule
from ortlstm.fit.state import EpochRecord, FitState
from ortlstm.training import Trainer
from ortlstm.training.checkpoint import Difference, atomic_write, differing_settings, saved_spec, settings_text

FIT_METADATA_KEY = "ortlstm.fit"
"""The checkpoint's metadata entry that holds fit's own state (JSON), beside the Trainer's."""
FIT_FORMAT = "ortlstm.fit/1"


def fit_config(
    batch_size: int,
    seed: int,
    samples: int,
    schedule: Schedule | None,
    names: Sequence[str],
    shuffle: bool,
    shards: list[list[Any]] | None,
) -> dict[str, Any]:
    """What a resumed run must share with the saved one (keys added later only when they differ from before)."""
    config = {
        "format": FIT_FORMAT,
        "batch_size": batch_size,
        "seed": seed,
        "samples": samples,
        "schedule": schedule.to_json() if schedule is not None else None,
        "arrays": list(names),
    }
    if not shuffle:
        config["shuffle"] = False
    if shards is not None:
        config["shards"] = shards
    return config


def save_checkpoint(trainer: Trainer, path: str | Path, config: Mapping[str, Any], state: FitState) -> Path:
    """Writes the Trainer's checkpoint with fit's state in its metadata, atomically.

    ``Trainer.save`` writes a temporary file in the checkpoint's directory; its tensors and
    metadata are written again, with ``FIT_METADATA_KEY`` added, through ``atomic_write``: a
    reader sees the old file or the new one, never a partial one, and the file gets the mode
    ``open()`` would give it (the umask's). ``Trainer.load`` and ``Trainer.from_checkpoint`` read
    it as any checkpoint.
    """
    from safetensors import safe_open
    from safetensors.numpy import save_file

    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    fit_state = {**config, "state": {**dataclasses.asdict(state)}}
    handle, saved = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    os.close(handle)
    try:
        trainer.save(saved)
        with safe_open(saved, framework="numpy") as reader:
            metadata = dict(reader.metadata() or {})
            tensors = {key: reader.get_tensor(key) for key in reader.keys()}  # noqa: SIM118 - not a dict
        metadata[FIT_METADATA_KEY] = json.dumps(fit_state)
        atomic_write(path, lambda temporary: save_file(tensors, temporary, metadata=metadata))
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(saved)
    return path


def read_fit_state(path: str | Path) -> tuple[dict[str, Any], FitState]:
    """The fit configuration and state of a checkpoint that ``save_checkpoint`` wrote.

    Raises:
        FileNotFoundError: No such file.
        ValueError: Not a safetensors file, or a checkpoint without fit state (``Trainer.save`` alone).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint {str(path)!r} to resume from (drop --resume to start)")
    try:
        with safe_open(str(path), framework="numpy") as reader:
            text = (reader.metadata() or {}).get(FIT_METADATA_KEY)
    except Exception as error:  # safetensors' own error type: not a checkpoint at all
        raise ValueError(
            f"--resume: {path} is not a safetensors file ({error}); pass the --checkpoint a run of fit wrote"
        ) from error
    if text is None:
        raise ValueError(f"{path}: a Trainer checkpoint without fit's state (epoch, shuffle order); not resumable")
    data = json.loads(text)
    state = data.pop("state")
    state["history"] = [EpochRecord(**record) for record in state["history"]]
    return data, FitState(**state)


_OPTION_NAMES = {
    "schedule.lr": "lr",
    "schedule.kind": "schedule",
    "schedule.unit": "schedule_unit",
    "loss.kind": "loss",
    "optimizer.name": "optimizer",
    "optimizer.weight_decay": "weight_decay",
    "prediction": "output",
}
"""A setting of fit's config or the Trainer's spec -> the option that sets it (else the name after ``schedule.``)."""

_DATA_SETTINGS = ("samples", "arrays", "shards")
"""fit's config settings that the data decides, not an option."""


def _schedule_epochs(schedule: Any) -> int | None:
    """The epochs a bound schedule's ``total`` stands for (its length, which a cosine schedule records)."""
    if not isinstance(schedule, Mapping) or schedule.get("total") is None:
        return None
    if schedule.get("unit") == "epoch":
        return int(schedule["total"])
    return int(schedule["total"]) // max(int(schedule.get("steps_per_epoch") or 1), 1)


def _as_options(saved: Mapping[str, Any], config: Mapping[str, Any]) -> list[Difference]:
    """fit's config settings that differ, named as the options that set them (``lr``, not ``schedule.lr``).

    ``schedule.steps_per_epoch`` follows from the samples and the batch size, and ``schedule.total``
    from them and the epochs: the epochs are named only where they differ. Another kind of schedule
    (None: the trainer's own lr) is named by its kind and lr, not field by field.
    """
    sides = [
        {**settings, "shuffle": settings.get("shuffle", True), "schedule": settings.get("schedule") or {"kind": None}}
        for settings in (saved, config)
    ]
    kinds = [side["schedule"]["kind"] for side in sides]
    differing: list[Difference] = []
    for name, old, new in differing_settings(sides[0], sides[1]):
        if name in ("schedule.steps_per_epoch", "schedule.total"):
            continue
        if (
            kinds[0] != kinds[1]
            and name.startswith("schedule.")
            and name != "schedule.kind"
            and (name != "schedule.lr" or None in kinds)  # another schedule: its kind says it (and its lr)
        ):
            continue
        differing.append((_OPTION_NAMES.get(name, name.removeprefix("schedule.")), old, new))
    epochs = _schedule_epochs(saved.get("schedule")), _schedule_epochs(config.get("schedule"))
    if None not in epochs and epochs[0] != epochs[1]:
        differing.append(("epochs", *epochs))
    return differing


def check_resumable(
    path: Path, saved: Mapping[str, Any], config: Mapping[str, Any], trainer: Trainer | None = None
) -> None:
    """Checks that a checkpoint's run (``saved``, from ``read_fit_state``) is this one (``config``, ``trainer``).

    Args:
        path: The checkpoint.
        saved: Its fit config.
        config: This run's (``fit_config``).
        trainer: This run's trainer: its spec is compared with the checkpoint's too, so that a
            refusal names fit's options (``Trainer.load`` would name the spec's fields).

    Raises:
        ValueError: A setting differs; the message names only those that differ, saved vs now,
            as the options that set them.
    """
    differing = _as_options(saved, config)
    if trainer is not None:
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as reader:
            metadata = dict(reader.metadata() or {})
        spec = saved_spec(path, metadata).graph_json()
        differing += [
            (_OPTION_NAMES.get(name, name), old, new)
            for name, old, new in differing_settings(spec, trainer.spec.graph_json())
        ]
    if differing:
        before, now = settings_text(differing)
        options = sum(name not in _DATA_SETTINGS for name, _, _ in differing)
        same = [f"the same option{'s' if options > 1 else ''}"] if options else []
        same += ["the same data"] if options < len(differing) else []
        raise ValueError(
            f"--resume: the checkpoint {path} was trained with {before}, this run has {now} (pass "
            f"{' and '.join(same)}, or start a new run without --resume)"
        )


def finished_message(path: Path, state: FitState, epochs: int, schedule: Mapping[str, Any] | None) -> str | None:
    """What a resumed run says when the checkpoint's run already did its ``epochs`` (None: it did not).

    A run whose epochs are all done has nothing left to train (Keras' ``fit`` and Lightning's
    ``Trainer`` stop there too); more epochs continue it, unless its schedule's length was bound
    to the run (cosine, linear-warmup), which a resume must keep.
    """
    if state.epoch < epochs:
        return None
    done = f"{path}: the run already finished its {state.epoch} epoch{'s' if state.epoch != 1 else ''}"
    if _schedule_epochs(schedule) is not None:
        return f"{done}; its schedule ends there (start a new run to train further)"
    return f"{done}; pass --epochs N with N > {state.epoch} to train further"
