"""What of an onnxruntime-training checkpoint a Trainer continues from, and what it cannot.

``import_checkpoint`` maps a checkpoint's parameters and AdamW moments onto a trainer's parameter
and optimizer-state inputs and says, in words, what was not carried over
(``Trainer.load_onnxruntime_training_checkpoint``). What is carried over:

- every parameter the trainer trains, by name, bitwise (all must be in the checkpoint, and every
  parameter the checkpoint trained must be trained there);
- with Adam or AdamW in the trainer, and a checkpoint saved with ``include_optimizer_state=True``:
  the first and second moments (onnxruntime-training's ``momentum0`` / ``momentum1`` are torch's
  ``exp_avg`` / ``exp_avg_sq``, measured equal) and the step count, which becomes ``global_step``.

What cannot be: onnxruntime-training's AdamW (``OptimType.AdamW``) is the Hugging Face flavour
(``adam_mode=1``): ``p -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)``, and
weight decay after the update, where torch divides ``sqrt(v)`` (not eps) by ``sqrt(1 - beta2^t)``
and decays first. The trainer follows torch, so the run continues from the same parameters and
moments on a slightly different trajectory (most in the first steps, where
``eps / sqrt(1 - beta2^t)`` is large; the two rules converge as t grows). A learning rate set
with ``set_learning_rate`` or a scheduler is not in the file (only the initial one), nor is the
loss. SGD keeps no state from onnxruntime-training (its SGD has none); torch's momentum buffer
starts empty. amsgrad's ``max_exp_avg_sq`` starts at ``exp_avg_sq``. Frozen parameters in the
checkpoint are left as the model has them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from ortlstm.graphs import optimizers
from ortlstm.graphs.train_step import TrainStepSignature
from ortlstm.ort_training.checkpoint import ORT_TRAINING_ADAMW_EPS, OrtTrainingCheckpoint
from ortlstm.training.checkpoint import check_values

# torch's Adam/AdamW state slot -> onnxruntime-training's AdamW moment (measured: same definitions).
_ORT_TRAINING_MOMENTS = {"exp_avg": "momentum0", "exp_avg_sq": "momentum1", "max_exp_avg_sq": "momentum1"}


@dataclasses.dataclass(frozen=True)
class OrtTrainingImport:
    """What ``Trainer.load_onnxruntime_training_checkpoint`` carried over (see this module's docstring).

    Attributes:
        parameters: The parameters loaded (bitwise).
        optimizer_state: Per parameter, the torch state slots filled from the checkpoint.
        global_step: The trainer's step count afterwards (the checkpoint's optimizer step).
        initial_lr: The checkpoint's initial learning rate, if it has one.
        properties: The checkpoint's user properties (e.g. an epoch a loop stored there).
        not_carried: What was not carried over, or differs from here on, in words.
    """

    parameters: tuple[str, ...]
    optimizer_state: dict[str, tuple[str, ...]]
    global_step: int
    initial_lr: float | None
    properties: dict[str, int | float | str]
    not_carried: tuple[str, ...]


def _check_parameters(content: OrtTrainingCheckpoint, where: str, signature: TrainStepSignature) -> None:
    missing = [name for name in signature.params if name not in content.parameters]
    if missing:
        raise ValueError(
            f"{where}: the onnxruntime-training checkpoint lacks the parameters {missing} this trainer trains "
            f"(it has {sorted(content.parameters)}); was it saved for another model?"
        )
    untrained = [name for name in content.parameters if name not in signature.params]
    if untrained:
        raise ValueError(
            f"{where}: the checkpoint trained {untrained}, which this trainer keeps constant (their trained "
            "values would be lost); build it with requires_grad naming them"
        )


def _moments(
    content: OrtTrainingCheckpoint,
    signature: TrainStepSignature,
    optimizer_name: str,
    values: dict[str, np.ndarray],
    notes: list[str],
) -> dict[str, tuple[str, ...]]:
    """Sets the optimizer state the checkpoint's moments fill in ``values``; per parameter, the slots filled."""
    carried: dict[str, tuple[str, ...]] = {}
    slots_here = {slot for name in signature.params for slot in signature.state[name]}
    if not content.moments:
        if slots_here:
            notes.append(
                "optimizer state: the checkpoint has none (save it with CheckpointState.save_checkpoint(state, "
                "path, include_optimizer_state=True)); moments start at zeros"
            )
        return carried
    if not {"exp_avg", "exp_avg_sq"} <= slots_here:
        notes.append(
            f"optimizer state: the checkpoint's AdamW moments are not carried: {optimizer_name} here does not keep them"
        )
        return carried
    for name in signature.params:
        moments = content.moments.get(name, {})
        slots = signature.state[name]
        taken = []
        for slot, moment in _ORT_TRAINING_MOMENTS.items():
            if slot in slots and moment in moments:
                values[slots[slot]] = moments[moment]
                taken.append(slot)
        carried[name] = tuple(taken)
        left = sorted(set(slots) - set(taken))
        if left:
            notes.append(f"optimizer state of {name!r}: {left} not in the checkpoint, start at zeros")
    if any("max_exp_avg_sq" in slots for slots in carried.values()):
        notes.append("amsgrad: max_exp_avg_sq starts at exp_avg_sq (onnxruntime-training keeps no maximum)")
    notes.append(
        "update rule: onnxruntime-training's AdamW is the Hugging Face flavour (eps not bias-corrected, "
        "weight decay after the update); this trainer follows torch, so the trajectory differs slightly"
    )
    return carried


def trainer_defaults(
    content: OrtTrainingCheckpoint,
    original: onnx.ModelProto,
    requires_grad: Sequence[str] | None,
    optimizer: optimizers.Optimizer | None,
) -> tuple[list[str] | Sequence[str], optimizers.Optimizer]:
    """``requires_grad`` and ``optimizer`` of a trainer continuing from ``content``, defaults filled.

    The default ``requires_grad``: the checkpoint's trained parameters (in the model's order);
    the default optimizer: torch's AdamW with the hyperparameters of onnxruntime-training's
    ``OptimType.AdamW`` and the checkpoint's initial lr.
    """
    if requires_grad is None:
        order = [init.name for init in original.graph.initializer]
        requires_grad = [name for name in order if name in content.parameters]
        requires_grad += [name for name in content.parameters if name not in requires_grad]
    if optimizer is None:
        initial_lr = content.initial_lr if content.initial_lr is not None else 1e-3
        optimizer = optimizers.AdamW(lr=initial_lr, eps=ORT_TRAINING_ADAMW_EPS, weight_decay=0.0)
    return requires_grad, optimizer


def import_checkpoint(
    content: OrtTrainingCheckpoint,
    where: str,
    signature: TrainStepSignature,
    initial: Mapping[str, np.ndarray],
    optimizer_name: str,
) -> tuple[dict[str, np.ndarray], OrtTrainingImport]:
    """A trainer's parameters and optimizer state from a checkpoint, by input name, and what was carried.

    Every optimizer-state slot is set: one the checkpoint does not fill restarts from
    ``initial``'s value (where it starts).

    Returns:
        The values, and what was carried over and what was not (its ``global_step`` is the
        trainer's step count from then on).

    Raises:
        ValueError: A parameter is missing, or trained there and constant here, or a value has
            another shape or type than ``initial``'s.
    """
    _check_parameters(content, where, signature)
    values: dict[str, np.ndarray] = {name: content.parameters[name] for name in signature.params}
    for name in signature.params:  # every slot is set: what is not carried restarts where it starts
        values.update({value: np.array(initial[value]) for value in signature.state[name].values()})
    notes: list[str] = []
    carried = _moments(content, signature, optimizer_name, values, notes)
    check_values(where, values, initial)
    if content.step is None:
        notes.append("step: the checkpoint has no optimizer step (saved without optimizer state); global_step is 0")
    notes.append("learning rate: only the initial one is in the checkpoint; pass lr= to continue a schedule")
    imported = OrtTrainingImport(
        parameters=tuple(signature.params),
        optimizer_state=carried,
        global_step=content.step if content.step is not None else 0,
        initial_lr=content.initial_lr,
        properties=dict(content.properties),
        not_carried=tuple(notes),
    )
    return values, imported
