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
    metadata are written again, with ``FIT_METADATA_KEY`` added, to a second temporary file there,
    which ``os.replace`` moves over the checkpoint: a reader sees the old file or the new one,
    never a partial one. ``Trainer.load`` and ``Trainer.from_checkpoint`` read it as any checkpoint.
    """
    from safetensors import safe_open
    from safetensors.numpy import save_file

    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    fit_state = {**config, "state": {**dataclasses.asdict(state)}}
    temporaries: list[str] = []
    try:
        for _ in range(2):
            handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
            os.close(handle)
            temporaries.append(name)
        trainer.save(temporaries[0])
        with safe_open(temporaries[0], framework="numpy") as reader:
            metadata = dict(reader.metadata() or {})
            tensors = {key: reader.get_tensor(key) for key in reader.keys()}  # noqa: SIM118 - not a dict
        metadata[FIT_METADATA_KEY] = json.dumps(fit_state)
        save_file(tensors, temporaries[1], metadata=metadata)
        with open(temporaries[1], "rb") as written:
            os.fsync(written.fileno())
        os.replace(temporaries[1], path)
    finally:
        for name in temporaries:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
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


def check_resumable(path: Path, saved: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """Checks that a checkpoint's run (``saved``, from ``read_fit_state``) is this one (``config``).

    Raises:
        ValueError: A setting differs; the message names each, saved vs now.
    """
    keys = [*config, *(key for key in saved if key not in config)]
    differing = [key for key in keys if saved.get(key) != config.get(key)]
    if differing:
        details = "; ".join(f"{key}: saved {saved.get(key)!r}, now {config.get(key)!r}" for key in differing)
        raise ValueError(
            f"{path}: the run was started with other settings ({details}); resume with the same data (and "
            "shards), --batch-size, --seed, --shuffle, --epochs and schedule, or start a new run"
        )
