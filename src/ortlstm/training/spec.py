"""``TrainingSpec``: the one list of a Trainer's options, and what each is for.

Every option of ``Trainer`` is a field here, with its role in the field's metadata, and the rest
derives from that list: the keywords of the ``build_training_models`` call (``build_arguments``),
the JSON a checkpoint or a training directory records (``to_json`` / ``from_json``), what a
loaded checkpoint is compared on (``graph_json``) and the keywords that rebuild a trainer
(``trainer_options``). Run-time options (the learning rate, threads, the non-finite mode) are
neither saved nor compared; the optimizer's ``lr`` is one of them too (only the default of the
train step's lr input), which its field declares. Each field's default is read from the table of
options (``ortlstm.training.options``), where it is written once for every surface.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.convert import MAX_IR_VERSION
from ortlstm.graphs.optimizers.clip import ClipGradNorm
from ortlstm.graphs.precision import matmul_precision
from ortlstm.graphs.train_step import TrainStepSignature
from ortlstm.training.options import DEFAULTS

LearningRate = float | Callable[[int], float]
"""A constant, or ``schedule(n) -> lr`` for the update that follows ``n`` completed updates."""

DEFAULT_TARGET: str = DEFAULTS["target"]
"""The target input's name when none is given (``Trainer(target=...)``; the table's default)."""


def _same(value: Any) -> Any:
    return value


def _list(values: Sequence[str]) -> list[str]:
    return list(values)


def _listed(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}


def _fixed_shapes(
    shapes: Mapping[str, Sequence[int | str | None]] | None,
) -> dict[str, tuple[int | str | None, ...]] | None:
    """``fixed_shapes`` in the spec's form (tuples, so that specs compare and hash alike)."""
    return None if shapes is None else {name: tuple(dims) for name, dims in shapes.items()}


def _names(keyword: str, names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as a tuple, refusing one string (``tuple("lstm")`` would be its characters).

    Raises:
        TypeError: A string, or not a sequence of strings.
    """
    if isinstance(names, str):
        raise TypeError(f"{keyword} must be a list of names, got the string {names!r}; pass {keyword}=[{names!r}]")
    try:
        values = tuple(names)
    except TypeError:
        raise TypeError(
            f"{keyword} must be a list of names, got {type(names).__name__} {names!r}; pass e.g. {keyword}=['lstm']"
        ) from None
    wrong = [value for value in values if not isinstance(value, str)]
    if wrong:
        raise TypeError(f"{keyword} must be a list of names (strings), got {wrong[0]!r} in {list(values)!r}")
    return values


def _mapping(keyword: str, value: Mapping[str, Any] | None, example: str) -> Iterator[tuple[str, Any]]:
    """The items of a mapping option (none for None).

    Raises:
        TypeError: Not a mapping (a list of dims without the input's name, a string).
    """
    if value is None:
        return iter(())
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{keyword} must be a mapping of input name -> value, got {type(value).__name__} {value!r}; "
            f"pass e.g. {keyword}={example}"
        )
    return iter(value.items())


def _is_number(value: Any) -> bool:
    """A real number as torch's options take it (bool is not one)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _check_option_types(spec: TrainingSpec) -> None:
    """Refuses an option of the wrong type before anything is built, naming the keyword and what to pass.

    Without this a string ``loss`` ends in ``'str' object has no attribute 'kind'``, a string ``lr``
    at the first step, and a negative ``clip_grad_norm`` flips the gradients' sign (``ClipGradNorm``).

    Raises:
        TypeError: A loss, optimizer or option of another type.
        ValueError: A value no run can use (a negative ``lr`` or ``clip_grad_norm``).
    """
    if not isinstance(spec.loss, losses.Loss):
        hint = f"Loss.{spec.loss}()" if isinstance(spec.loss, str) and hasattr(losses.Loss, spec.loss) else None
        raise TypeError(
            f"loss must be an ortlstm.graphs.losses.Loss, got {type(spec.loss).__name__} {spec.loss!r}; "
            f"pass loss={hint or 'Loss.cross_entropy()'} (torch.nn.functional's names and keywords)"
        )
    if not isinstance(spec.optimizer, optimizers.Optimizer):
        given = spec.optimizer
        named = {key.lower(): key for key in optimizers.OPTIMIZERS}
        text = given.__name__ if isinstance(given, type) else given if isinstance(given, str) else "AdamW"
        name = named.get(text.lower(), "AdamW")
        what = "the class" if isinstance(given, type) else type(given).__name__
        raise TypeError(
            f"optimizer must be an ortlstm.graphs.optimizers optimizer instance, got {what} {given!r}; "
            f"pass optimizer={name}(lr=1e-3) (ortlstm.graphs.optimizers.{name}, torch.optim's keywords)"
        )
    if spec.lr is not None and not (callable(spec.lr) or _is_number(spec.lr)):
        raise TypeError(f"lr must be a number or a schedule f(done) -> lr, got {type(spec.lr).__name__} {spec.lr!r}")
    if spec.lr is not None and not callable(spec.lr) and not spec.lr >= 0.0:
        raise ValueError(f"Invalid learning rate: {spec.lr}")  # torch.optim's words
    if callable(spec.lr):
        try:
            inspect.signature(spec.lr).bind(0)
        except TypeError:
            raise TypeError(
                f"lr: a schedule is called with the number of updates done (lr(0) for the first), but {spec.lr!r} "
                "cannot take one argument; pass e.g. lr=lambda done: 1e-3 * 0.95 ** done"
            ) from None
        except ValueError:  # a builtin without a signature: called as it is
            pass
    if isinstance(spec.ir_version, bool) or not isinstance(spec.ir_version, (int, np.integer)):
        raise TypeError(f"ir_version must be an int (e.g. {MAX_IR_VERSION}), got {spec.ir_version!r}")
    if spec.clip_grad_norm is not None:
        ClipGradNorm(spec.clip_grad_norm, spec.clip_norm_type)  # its checks (the builder's, before it runs)
    threads = spec.threads
    if threads is not None and (not isinstance(threads, (int, np.integer)) or isinstance(threads, bool) or threads < 0):
        raise TypeError(
            f"threads must be an int >= 0 (onnxruntime's intra-op threads; 0: its choice) or None, got {threads!r}"
        )
    if not isinstance(spec.stateful, (bool, np.bool_)):
        raise TypeError(f"stateful must be True or False, got {type(spec.stateful).__name__} {spec.stateful!r}")
    matmul_precision(spec.precision)  # a clear error listing both names
    for keyword, value in (("output", spec.prediction), ("target", spec.target)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{keyword} must be a name (a string), got {type(value).__name__} {value!r}")


# ---- the JSON of each field that is saved ----------------------------------------------------------


def _loss_to_json(loss: losses.Loss) -> dict[str, Any]:
    data = {field.name: getattr(loss, field.name) for field in dataclasses.fields(loss)}
    for key in ("weight", "pos_weight"):
        if data[key] is not None:
            data[key] = np.asarray(data[key]).tolist()
    return data


def _loss_from_json(data: Mapping[str, Any]) -> losses.Loss:
    return losses.Loss(**data)


def _optimizer_to_json(optimizer: optimizers.Optimizer) -> dict[str, Any]:
    values = {field.name: getattr(optimizer, field.name) for field in dataclasses.fields(optimizer)}
    return {"name": optimizer.torch_name, **_listed(values)}


def _optimizer_from_json(data: Mapping[str, Any]) -> optimizers.Optimizer:
    values = dict(data)
    return optimizers.optimizer_from_torch(values.pop("name"), **values)


def _groups_to_json(groups: Sequence[optimizers.ParamGroup]) -> list[dict[str, Any]]:
    return [_listed(dataclasses.asdict(group)) for group in groups]


def _groups_from_json(data: Sequence[Mapping[str, Any]]) -> tuple[optimizers.ParamGroup, ...]:
    return tuple(optimizers.ParamGroup(**group) for group in data)


def _shapes_to_json(shapes: Mapping[str, Sequence[int | str | None]] | None) -> dict[str, Any] | None:
    return _listed(shapes) if shapes is not None else None


# ---- each field's argument of build_training_models ------------------------------------------------


def _target_name(target: str | None) -> str:
    return DEFAULT_TARGET if target is None else target


def _shapes_to_build(shapes: Mapping[str, Sequence[int | str | None]] | None) -> dict[str, list[Any]] | None:
    # Lists, as a user writes them: the builder's messages show the dims as given.
    return None if shapes is None else {name: list(dims) for name, dims in shapes.items()}


def _fixed_inputs_to_build(values: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray] | None:
    return values or None


# ---- the roles ----------------------------------------------------------------------------------------


Codec = tuple[Callable[[Any], Any], Callable[[Any], Any]]
"""(encode, decode) of a field's value in the spec's JSON."""


@dataclasses.dataclass(frozen=True)
class Role:
    """What a spec field is for: its metadata (``field.metadata["role"]``).

    Attributes:
        saved: (encode, decode) of its value in the spec's JSON; None: not in the JSON (a
            run-time option, or one a checkpoint saves otherwise).
        optional_in_json: Added after the format: a JSON without it means the default.
        build: Converts its value to the ``build_training_models`` argument of the same keyword;
            None: not passed to the builder.
        keyword: Its keyword in ``Trainer`` and the builder, when not the field's name.
        runtime_keys: Keys of its JSON that are run-time values: saved, not compared on load.
    """

    saved: Codec | None = None
    optional_in_json: bool = False
    build: Callable[[Any], Any] | None = None
    keyword: str | None = None
    runtime_keys: tuple[str, ...] = ()


def _role(**role: Any) -> dict[str, Role]:
    return {"role": Role(**role)}


def _roles(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Role]]:
    for field in dataclasses.fields(cls):
        yield field, field.metadata["role"]


_PLAIN: Codec = (_same, _same)
_NAMES: Codec = (_list, tuple)


@dataclasses.dataclass(frozen=True)
class TrainingSpec:
    """A Trainer's options: what decides the training graphs (saved with every checkpoint) and the run-time ones.

    Attributes:
        loss: The loss.
        optimizer: The optimizer and its hyperparameters (its ``lr`` is the learning rate unless
            ``lr`` is given: a run-time value, not compared when a checkpoint is loaded).
        requires_grad: The trained parameters (a trainer's spec: resolved, never None; None
            before building: the default choice).
        prediction: The model output the loss reads (``Trainer(output=...)``; None before
            building: the model's only output).
        target: Name of the target input (a trainer's spec: None when a model output is the loss).
        extra_outputs: Model outputs a step returns with the loss.
        param_groups: Per-group optimizer overrides.
        clip_grad_norm: Maximum global gradient norm, or None.
        clip_norm_type: The norm's type.
        clip_grad_value: Bound of every gradient element's absolute value, or None.
        stateful: Each LSTM's final state is the next step's initial state (truncated BPTT).
        frozen: Names, globs or module prefixes of parameters left untrained (as given).
        fixed_shapes: Input shapes fixed for training (``prepare_model``), or None.
        ir_version: The IR version of the training models.
        fixed_inputs: Model inputs fixed for training (constants of the graphs; a checkpoint
            saves them as tensors, not in the JSON).
        lr: Run-time: a constant learning rate or a schedule; None: the optimizer's ``lr``.
        threads: Run-time: onnxruntime intra-op threads (None: onnxruntime's choice).
        nonfinite: Run-time: ``"raise"`` or ``"skip"`` (``Trainer(nonfinite=...)``).
        precision: ``"32-true"`` or ``"bf16-mixed"`` (``ortlstm.graphs.precision``): saved, and a
            checkpoint of the other precision is refused on load, as other graph options are.
    """

    loss: losses.Loss = dataclasses.field(metadata=_role(saved=(_loss_to_json, _loss_from_json), build=_same))
    optimizer: optimizers.Optimizer = dataclasses.field(
        metadata=_role(saved=(_optimizer_to_json, _optimizer_from_json), build=_same, runtime_keys=("lr",))
    )
    requires_grad: tuple[str, ...] | None = dataclasses.field(
        default=DEFAULTS["requires_grad"], metadata=_role(saved=_NAMES, build=_same)
    )
    prediction: str | None = dataclasses.field(
        default=DEFAULTS["output"], metadata=_role(saved=_PLAIN, build=_same, keyword="output")
    )
    target: str | None = dataclasses.field(default=DEFAULTS["target"], metadata=_role(saved=_PLAIN, build=_target_name))
    extra_outputs: tuple[str, ...] = dataclasses.field(
        default=DEFAULTS["extra_outputs"], metadata=_role(saved=_NAMES, build=_same)
    )
    param_groups: tuple[optimizers.ParamGroup, ...] = dataclasses.field(
        default=DEFAULTS["param_groups"], metadata=_role(saved=(_groups_to_json, _groups_from_json), build=_same)
    )
    clip_grad_norm: float | None = dataclasses.field(
        default=DEFAULTS["clip_grad_norm"], metadata=_role(saved=_PLAIN, build=_same)
    )
    clip_norm_type: float = dataclasses.field(
        default=DEFAULTS["clip_norm_type"], metadata=_role(saved=_PLAIN, build=_same)
    )
    clip_grad_value: float | None = dataclasses.field(
        default=DEFAULTS["clip_grad_value"], metadata=_role(saved=_PLAIN, optional_in_json=True, build=_same)
    )
    stateful: bool = dataclasses.field(
        default=DEFAULTS["stateful"], metadata=_role(saved=(_same, bool), optional_in_json=True)
    )
    frozen: tuple[str, ...] = dataclasses.field(
        default=DEFAULTS["frozen"], metadata=_role(saved=_NAMES, optional_in_json=True, build=_same)
    )
    fixed_shapes: dict[str, tuple[int | str | None, ...]] | None = dataclasses.field(
        default=DEFAULTS["fixed_shapes"],
        metadata=_role(saved=(_shapes_to_json, _fixed_shapes), optional_in_json=True, build=_shapes_to_build),
    )
    ir_version: int = dataclasses.field(
        default=DEFAULTS["ir_version"], metadata=_role(saved=(_same, int), optional_in_json=True, build=_same)
    )
    fixed_inputs: dict[str, np.ndarray] = dataclasses.field(
        default_factory=dict, compare=False, metadata=_role(build=_fixed_inputs_to_build)
    )
    lr: LearningRate | None = dataclasses.field(default=DEFAULTS["lr"], metadata=_role())
    threads: int | None = dataclasses.field(default=DEFAULTS["threads"], metadata=_role())
    nonfinite: str = dataclasses.field(default=DEFAULTS["nonfinite"], metadata=_role())
    precision: str = dataclasses.field(
        default=DEFAULTS["precision"], metadata=_role(saved=_PLAIN, optional_in_json=True, build=_same)
    )

    def __post_init__(self) -> None:
        _check_option_types(self)

    @classmethod
    def from_options(
        cls,
        *,
        requires_grad: Sequence[str] | None = DEFAULTS["requires_grad"],
        output: str | None = DEFAULTS["output"],
        extra_outputs: Sequence[str] = DEFAULTS["extra_outputs"],
        param_groups: Sequence[optimizers.ParamGroup] = DEFAULTS["param_groups"],
        frozen: Sequence[str] = DEFAULTS["frozen"],
        fixed_inputs: Mapping[str, Any] | None = DEFAULTS["fixed_inputs"],
        fixed_shapes: Mapping[str, Sequence[int | str | None]] | None = DEFAULTS["fixed_shapes"],
        **options: Any,
    ) -> TrainingSpec:
        """A spec from ``Trainer``'s keywords, as given (sequences and mappings in the spec's form)."""
        return cls(
            requires_grad=None if requires_grad is None else _names("requires_grad", requires_grad),
            prediction=output,
            extra_outputs=_names("extra_outputs", extra_outputs),
            param_groups=optimizers.as_param_groups(param_groups, "param_groups"),
            frozen=_names("frozen", frozen),
            fixed_inputs={
                name: np.asarray(value) for name, value in _mapping("fixed_inputs", fixed_inputs, "{'rate': 16000}")
            },
            fixed_shapes=None
            if fixed_shapes is None
            else _fixed_shapes(dict(_mapping("fixed_shapes", fixed_shapes, "{'x': [None, 40, 1]}"))),
            **options,
        )

    def trainer_options(self) -> dict[str, Any]:
        """``Trainer``'s keywords for this spec (``Trainer(model, **spec.trainer_options())``)."""
        options = {role.keyword or field.name: getattr(self, field.name) for field, role in _roles(type(self))}
        options["target"] = _target_name(self.target)
        return options

    def build_arguments(self) -> dict[str, Any]:
        """The keywords of ``build_training_models`` for this spec."""
        return {
            role.keyword or field.name: role.build(getattr(self, field.name))
            for field, role in _roles(type(self))
            if role.build is not None
        }

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready description of what decides the graphs (exact floats: JSON keeps Python's repr)."""
        return {
            field.name: role.saved[0](getattr(self, field.name))
            for field, role in _roles(type(self))
            if role.saved is not None
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainingSpec:
        """The inverse of ``to_json`` (the run-time options at their defaults).

        Raises:
            KeyError: A field every saved spec holds is missing.
        """
        return cls(
            **{
                field.name: role.saved[1](data[field.name])
                for field, role in _roles(cls)
                if role.saved is not None and (field.name in data or not role.optional_in_json)
            }
        )

    def graph_json(self) -> dict[str, Any]:
        """``to_json`` without its run-time values (the optimizer's lr): what a loaded checkpoint must match."""
        data = self.to_json()
        for field, role in _roles(type(self)):
            if role.runtime_keys:
                data[field.name] = {
                    key: value for key, value in data[field.name].items() if key not in role.runtime_keys
                }
        return data

    def differences(self, saved: TrainingSpec) -> list[str]:
        """What differs in ``graph_json`` between a saved spec and this one, in words (empty: none)."""
        mine, theirs = self.graph_json(), saved.graph_json()
        return [
            f"{key}: saved {theirs.get(key)!r}, here {mine[key]!r}"
            for key in sorted(mine)
            if theirs.get(key) != mine[key]
        ]


def signature_from_json(data: Mapping[str, Any]) -> TrainStepSignature:
    """The signature a training directory's manifest records (lists back to tuples)."""
    fields = {field.name for field in dataclasses.fields(TrainStepSignature)}
    values: dict[str, Any] = {
        key: tuple(value) if isinstance(value, list) else value for key, value in data.items() if key in fields
    }
    return TrainStepSignature(**values)


def signature_to_json(signature: TrainStepSignature) -> dict[str, Any]:
    """The inverse of ``signature_from_json``."""
    return _listed(dataclasses.asdict(signature))
