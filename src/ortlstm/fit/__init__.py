"""``ortlstm fit``: one call from data files to a trained model, over ``ortlstm.training.Trainer``.

Reads named arrays (.npz, .safetensors, folders of .npy, folders of memory-mapped shards:
``ortlstm.datafiles``), checks them against the model's inputs and the loss's targets before
anything is trained, then runs epochs of seeded shuffled batches with validation,
a learning-rate schedule, an atomic checkpoint per epoch (resumable bitwise, also after Ctrl-C),
the trained model's export and a plot. It drives the Trainer's public API only; it never changes
how a step is computed.

The parts, in the order a fit uses them: ``options`` (the Trainer's keywords, ``--config`` files),
``schedule`` (learning-rate schedules), ``arrays`` (what the data must be, checked), ``loop`` (the
epochs), ``evaluation`` (validation), ``state`` and ``checkpoint`` (where a run stands, resume),
``report`` (the plot), ``parallel`` (the ranks when ``mpirun``/``srun`` starts it, ``--accumulate``).
"""

from __future__ import annotations

from ortlstm.datafiles import (  # read_arrays: fit's own reader, as before
    ConcatenatedRows,
    ShardedArray,
    bind_batch_axes,
    read_arrays,
    shard_files,
    take_rows,
)
from ortlstm.fit.arrays import (
    ArraySpec,
    carried_states,
    check_data,
    data_specs,
    declared_batch_axis,
    prepare_data,
)
from ortlstm.fit.checkpoint import FIT_FORMAT, FIT_METADATA_KEY, read_fit_state, save_checkpoint
from ortlstm.fit.evaluation import evaluate_data
from ortlstm.fit.loop import fit
from ortlstm.fit.options import CONFIG_SUFFIXES, TRAINER_OPTIONS, build_trainer, param_groups_from_json, read_config
from ortlstm.fit.report import plot_history
from ortlstm.fit.schedule import SCHEDULE_UNITS, SCHEDULES, Schedule
from ortlstm.fit.state import EpochRecord, FitResult, FitState, StepInfo

__all__ = [
    "CONFIG_SUFFIXES",
    "FIT_FORMAT",
    "FIT_METADATA_KEY",
    "SCHEDULES",
    "SCHEDULE_UNITS",
    "TRAINER_OPTIONS",
    "ArraySpec",
    "ConcatenatedRows",
    "EpochRecord",
    "FitResult",
    "FitState",
    "Schedule",
    "ShardedArray",
    "StepInfo",
    "bind_batch_axes",
    "build_trainer",
    "carried_states",
    "check_data",
    "data_specs",
    "declared_batch_axis",
    "evaluate_data",
    "fit",
    "param_groups_from_json",
    "plot_history",
    "prepare_data",
    "read_arrays",
    "read_config",
    "read_fit_state",
    "save_checkpoint",
    "shard_files",
    "take_rows",
]
