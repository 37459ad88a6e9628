"""Conformance cases of the ortlstm domain: generated from the reference, run against any backend.

Role in the flow: the op contract as data another implementation can be checked against. Each case
is a directory in ONNX's node-test layout (as ``onnx/backend/test/data/node/test_*``)::

    <case>/model.onnx                   one LSTMTraining or LSTMGrad node, or LSTMTraining -> LSTMGrad
    <case>/test_data_set_0/input_<k>.pb  TensorProto of graph input k, named as the input
    <case>/test_data_set_0/output_<k>.pb TensorProto of graph output k, named as the output

The expected outputs are computed by ``ortlstm.reference`` through ``onnx.reference``'s
``ReferenceEvaluator``. The cases cover every attribute, float32 and float64, both layouts,
sequence_lens with zeros, omitted optional inputs and outputs, T=1 and batch 1, the 12-input form
of LSTMGrad that com.microsoft's LSTMGrad takes, and LSTMGrad fed by LSTMTraining in one graph.
Tensors are tiny. The repository keeps a generated copy in tests/conformance/data/node; a test
regenerates it and fails on drift. Command line::

    python -m ortlstm.conformance generate DIR        # write the cases
    python -m ortlstm.conformance run DIR [--backend onnxruntime|reference|module:Class]

In Python, ``run(backend, directory)`` takes ``"onnxruntime"`` (onnxruntime with the ortlstm
kernel library), ``"reference"`` (``ReferenceEvaluator`` with ``ortlstm.reference.OPS``) or any
``onnx.backend.base.Backend``, and returns one ``CaseResult`` per case. Outputs must match within
``TOLERANCES`` of their element type.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import shutil
import sys
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.backend.base
import onnx.helper
import onnx.numpy_helper

import ortlstm.ops
from ortlstm.ops import schema

IR_VERSION = 10  # onnxruntime-training 1.19 loads IR <= 10
ONNX_OPSET = 17
DATA_SET = "test_data_set_0"
CASE_PREFIX = "test_ortlstm_"

TOLERANCES: dict[str, tuple[float, float]] = {"float32": (1e-4, 1e-5), "float64": (1e-10, 1e-12)}
"""Element type -> (rtol, atol) of ``numpy.testing.assert_allclose`` for a backend's outputs.

float32: the expected values are float64 results rounded once, and a float32 kernel rounds at
every step and may use fast approximations of tanh and sigmoid. float64: rounding only.
"""

_ELEM_TYPES = {"float32": onnx.TensorProto.FLOAT, "float64": onnx.TensorProto.DOUBLE}
_TRAINING = schema.LSTM_TRAINING
_GRAD = schema.LSTM_GRAD
_STASH = ("HAll", "CAll", "IOFC")
_FORWARD_INPUTS = schema.input_names(_TRAINING)
_ALL_FORWARD_OUTPUTS = schema.output_names(_TRAINING)
_ALL_GRAD_OUTPUTS = schema.output_names(_GRAD)
_UPSTREAM_GRADIENTS = tuple(port.name for port in _GRAD.inputs if port.gradient_of in _ALL_FORWARD_OUTPUTS)


@dataclasses.dataclass(frozen=True)
class CaseSpec:
    """One conformance case, as data.

    Attributes:
        name: Case name without the ``test_ortlstm_`` prefix and the dtype suffix.
        doc: What the case checks (the model's doc_string).
        dims: (seq_length, batch_size, input_size, hidden_size).
        attributes: Node attributes (both nodes of a chained case share them).
        inputs: Present inputs of the first node, by port name.
        outputs: Present outputs of the first node that are graph outputs, by port name.
        grad: ``""``: LSTMTraining alone; ``"node"``: LSTMGrad alone, the stash fed as graph
            inputs (computed by the reference); ``"chained"``: LSTMTraining feeding LSTMGrad.
        grad_inputs: Present inputs of LSTMGrad, by port name (stash ports included).
        grad_outputs: Present outputs of LSTMGrad, by port name.
        sequence_lens: Values of sequence_lens, when it is an input.
    """

    name: str
    doc: str
    dims: tuple[int, int, int, int]
    attributes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    inputs: tuple[str, ...] = ("X", "W", "R")
    outputs: tuple[str, ...] = _ALL_FORWARD_OUTPUTS
    grad: str = ""
    grad_inputs: tuple[str, ...] = ()
    grad_outputs: tuple[str, ...] = _ALL_GRAD_OUTPUTS
    sequence_lens: tuple[int, ...] | None = None


_ALL_INPUTS = _FORWARD_INPUTS
_GRAD_ALL_INPUTS = schema.input_names(_GRAD)
_COM_MICROSOFT_INPUTS = tuple(name for name in _GRAD_ALL_INPUTS if name != "P")  # its 12 inputs
_PER_ACTIVATION = {  # alpha and beta for every activation, as other exporters write them
    "activations": ["HardSigmoid", "ScaledTanh", "Affine", "LeakyRelu", "Elu", "ThresholdedRelu"],
    "activation_alpha": [0.3, 1.2, 0.8, 0.2, 0.7, 0.1],
    "activation_beta": [0.45, 0.6, 0.1, 9.0, 9.0, 9.0],
}

SPECS: tuple[CaseSpec, ...] = (
    CaseSpec("training_defaults", "Only X, W, R; default attributes; every output.", (3, 2, 3, 2)),
    CaseSpec(
        "training_all_inputs",
        "B, initial_h, initial_c and peepholes P.",
        (3, 2, 3, 3),
        inputs=("X", "W", "R", "B", "initial_h", "initial_c", "P"),
    ),
    CaseSpec(
        "training_reverse_sequence_lens",
        "direction=reverse with sequence_lens 3, 0, 1: a length-0 entry gives zero outputs, Ht and Ct.",
        (3, 3, 2, 2),
        {"direction": "reverse"},
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c"),
        sequence_lens=(3, 0, 1),
    ),
    CaseSpec(
        "training_bidirectional_layout1",
        "direction=bidirectional, layout=1 (batch first), sequence_lens with a zero, peepholes.",
        (3, 3, 2, 2),
        {"direction": "bidirectional", "layout": 1},
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
        sequence_lens=(2, 0, 3),
    ),
    CaseSpec(
        "training_layout1",
        "layout=1, forward, initial state.",
        (2, 3, 2, 3),
        {"layout": 1},
        inputs=("X", "W", "R", "B", "initial_h", "initial_c"),
    ),
    CaseSpec(
        "training_clip_input_forget",
        "clip=0.5 (gate pre-activations clamped) and input_forget=1 (f = 1 - i), peepholes.",
        (3, 2, 3, 2),
        {"clip": 0.5, "input_forget": 1},
        inputs=("X", "W", "R", "B", "initial_c", "P"),
    ),
    CaseSpec(
        "training_activations_per_activation_alpha_beta",
        "Bidirectional, six parametrized activations, activation_alpha and activation_beta with one value per "
        "activation (onnxruntime's LSTM takes them in order, each activation the next value of the lists it reads, "
        "and ignores the surplus).",
        (2, 2, 2, 2),
        {"direction": "bidirectional", **_PER_ACTIVATION},
        inputs=("X", "W", "R", "B", "initial_h", "initial_c"),
    ),
    CaseSpec(
        "training_activations_defaults_any_case",
        "Activation names in any case; alpha/beta lists shorter than the activations that read them (the rest take "
        "the defaults).",
        (2, 2, 2, 2),
        {
            "direction": "bidirectional",
            "activations": ["sigmoid", "SOFTSIGN", "Softplus", "HardSigmoid", "relu", "LeakyRelu"],
            "activation_alpha": [0.25],
        },
        inputs=("X", "W", "R", "B", "initial_h", "initial_c"),
    ),
    CaseSpec(
        "training_activations_csv_only",
        "Activations given only as activations_csv (onnxruntime older than 1.25 cannot pass string lists).",
        (2, 2, 2, 2),
        {"activations_csv": "Sigmoid,Tanh,Softsign"},
        inputs=("X", "W", "R", "B"),
    ),
    CaseSpec(
        "training_omitted_outputs_ht",
        "Only Ht: outputs HAll omitted (empty name), the rest trailing.",
        (3, 2, 2, 2),
        inputs=("X", "W", "R", "B"),
        outputs=("Ht",),
    ),
    CaseSpec(
        "training_omitted_outputs_hall_ct",
        "HAll and Ct only; Ht omitted in the middle.",
        (2, 2, 2, 2),
        inputs=("X", "W", "R", "B", "initial_h"),
        outputs=("HAll", "Ct"),
    ),
    CaseSpec(
        "training_omitted_middle_inputs",
        "B, sequence_lens and initial_h omitted in the middle (empty names), initial_c and P given.",
        (2, 2, 3, 2),
        inputs=("X", "W", "R", "initial_c", "P"),
    ),
    CaseSpec("training_t1_batch1", "seq_length 1, batch_size 1.", (1, 1, 3, 2), inputs=("X", "W", "R", "B")),
    CaseSpec(
        "training_size1",
        "input_size 1 and hidden_size 1, bidirectional.",
        (2, 2, 1, 1),
        {"direction": "bidirectional"},
        inputs=("X", "W", "R", "B", "P"),
    ),
    CaseSpec(
        "grad_all_inputs",
        "LSTMGrad alone, every input, the stash from LSTMTraining; every output.",
        (3, 2, 3, 2),
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
        grad="node",
        grad_inputs=_GRAD_ALL_INPUTS,
        sequence_lens=(3, 2),
    ),
    CaseSpec(
        "grad_com_microsoft_inputs",
        "The 12 inputs of com.microsoft LSTMGrad, in its order (no P): the drop-in form.",
        (3, 2, 2, 2),
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c"),
        grad="node",
        grad_inputs=_COM_MICROSOFT_INPUTS,
        sequence_lens=(3, 1),
    ),
    CaseSpec(
        "grad_only_ht_omitted_outputs",
        "Only grad_Ht, no initial state; only dW and dR requested.",
        (3, 2, 2, 2),
        inputs=("X", "W", "R", "B"),
        grad="node",
        grad_inputs=("X", "W", "R", *_STASH, "grad_Ht"),
        grad_outputs=("dW", "dR"),
    ),
    CaseSpec(
        "grad_bidirectional_layout1_sequence_lens",
        "Bidirectional, layout=1, sequence_lens with a zero, peepholes.",
        (3, 3, 2, 2),
        {"direction": "bidirectional", "layout": 1},
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
        grad="node",
        grad_inputs=_GRAD_ALL_INPUTS,
        sequence_lens=(0, 3, 2),
    ),
    CaseSpec(
        "grad_t1_batch1_reverse",
        "seq_length 1, batch_size 1, reverse.",
        (1, 1, 2, 3),
        {"direction": "reverse"},
        inputs=("X", "W", "R", "B", "initial_h", "initial_c"),
        grad="node",
        grad_inputs=_COM_MICROSOFT_INPUTS,
        sequence_lens=(1,),
    ),
    CaseSpec(
        "chained_clip_peephole_bidirectional",
        "LSTMTraining feeding LSTMGrad in one graph: clip, peepholes, bidirectional, sequence_lens with a zero.",
        (3, 3, 2, 2),
        {"direction": "bidirectional", "clip": 0.6},
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
        outputs=("HAll", "Ht", "Ct"),
        grad="chained",
        grad_inputs=_GRAD_ALL_INPUTS,
        sequence_lens=(3, 0, 2),
    ),
    CaseSpec(
        "chained_activations_input_forget_layout1",
        "LSTMTraining feeding LSTMGrad: per-activation alpha/beta lists, input_forget, layout=1, reverse.",
        (3, 2, 2, 2),
        {
            "direction": "reverse",
            "layout": 1,
            "input_forget": 1,
            "activations": ["HardSigmoid", "Softsign", "Elu"],
            "activation_alpha": [0.3, 0.8, 0.5],
            "activation_beta": [0.45, 1.0, 1.0],
        },
        inputs=("X", "W", "R", "B", "initial_h", "initial_c"),
        outputs=("Ht",),
        grad="chained",
        grad_inputs=("X", "W", "R", "initial_h", "initial_c", *_STASH, "grad_HAll", "grad_Ht"),
    ),
)
"""Every case, each generated in float32 and float64."""


# ---------------------------------------------------------------------------------------------
# Generation


def _value_info(name: str, dtype: str, shape: Sequence[int]) -> onnx.ValueInfoProto:
    elem = onnx.TensorProto.INT32 if name == "sequence_lens" else _ELEM_TYPES[dtype]
    return onnx.helper.make_tensor_value_info(name, elem, list(shape))


def _port_shape(port: schema.PortSpec, spec: CaseSpec) -> tuple[int, ...]:
    seq_length, batch_size, input_size, hidden_size = spec.dims
    dims = {
        "seq_length": seq_length,
        "batch_size": batch_size,
        "input_size": input_size,
        "hidden_size": hidden_size,
        "num_directions": schema.num_directions(spec.attributes.get("direction", "forward")),
    }
    layout = int(spec.attributes.get("layout", 0))
    result = []
    for expression in schema.shape_for_layout(port, layout):
        factor, name = schema.parse_dim(expression)
        result.append(factor * dims[name])
    return tuple(result)


def _ports(op: schema.OpSpec) -> dict[str, schema.PortSpec]:
    return {port.name: port for port in op.inputs + op.outputs}


def build_model(spec: CaseSpec, dtype: str) -> onnx.ModelProto:
    """The case's model: graph inputs and outputs named after the ports, with static shapes."""
    attributes = {"hidden_size": spec.dims[3], **spec.attributes}
    nodes = []
    graph_inputs: list[str] = []
    graph_outputs: list[str] = []
    shapes = {**{name: _port_shape(port, spec) for name, port in _ports(_TRAINING).items()}}
    shapes.update({name: _port_shape(port, spec) for name, port in _ports(_GRAD).items()})
    if spec.grad != "node":
        forward_outputs = _ALL_FORWARD_OUTPUTS if spec.grad == "chained" else spec.outputs
        nodes.append(
            ortlstm.ops.make_node(
                _TRAINING.name,
                {name: name for name in spec.inputs},
                {name: name for name in forward_outputs},
                name="training",
                **attributes,
            )
        )
        graph_inputs += list(spec.inputs)
        graph_outputs += list(spec.outputs)
    if spec.grad:
        nodes.append(
            ortlstm.ops.make_node(
                _GRAD.name,
                {name: name for name in spec.grad_inputs},
                {name: name for name in spec.grad_outputs},
                name="grad",
                **attributes,
            )
        )
        produced = set(_ALL_FORWARD_OUTPUTS) if spec.grad == "chained" else set()
        graph_inputs += [name for name in spec.grad_inputs if name not in produced and name not in graph_inputs]
        graph_outputs += list(spec.grad_outputs)
    graph = onnx.helper.make_graph(
        nodes,
        spec.name,
        [_value_info(name, dtype, shapes[name]) for name in graph_inputs],
        [_value_info(name, dtype, shapes[name]) for name in graph_outputs],
    )
    model = onnx.helper.make_model(
        graph,
        opset_imports=[
            onnx.helper.make_opsetid("", ONNX_OPSET),
            onnx.helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION),
        ],
        ir_version=IR_VERSION,
        producer_name="ortlstm.conformance",
        doc_string=spec.doc,
    )
    return model


def _draw_inputs(spec: CaseSpec, dtype: str) -> dict[str, np.ndarray]:
    """Inputs of every forward port and upstream gradient, float32-representable, seeded by the name."""
    rng = np.random.default_rng(zlib.crc32(spec.name.encode()))
    _, _, input_size, hidden_size = spec.dims
    scales = {
        "X": 1.0,
        "W": 1.0 / np.sqrt(input_size),
        "R": 0.7 / np.sqrt(hidden_size),
        "B": 0.3,
        "initial_h": 0.8,
        "initial_c": 0.8,
        "P": 0.5,
    }
    values = {}
    ports = _ports(_TRAINING) | _ports(_GRAD)
    for name in (*_FORWARD_INPUTS, *_UPSTREAM_GRADIENTS):
        if name == "sequence_lens":
            if spec.sequence_lens is not None:
                values[name] = np.array(spec.sequence_lens, dtype=np.int32)
            continue
        draw = rng.standard_normal(_port_shape(ports[name], spec)) * scales.get(name, 1.0)
        values[name] = draw.astype(np.float32).astype(dtype)
    return values


def _reference_session(model: onnx.ModelProto) -> Any:
    from onnx.reference import ReferenceEvaluator

    import ortlstm.reference

    return ReferenceEvaluator(model, new_ops=list(ortlstm.reference.OPS))


def case_name(spec: CaseSpec, dtype: str) -> str:
    """The directory name of a case: ``test_ortlstm_<name>_<dtype>``."""
    return f"{CASE_PREFIX}{spec.name}_{dtype}"


def generate_case(spec: CaseSpec, dtype: str) -> tuple[onnx.ModelProto, list[np.ndarray], list[np.ndarray]]:
    """The model, its inputs and the reference's outputs, both in graph order."""
    model = build_model(spec, dtype)
    values = _draw_inputs(spec, dtype)
    if spec.grad == "node":
        # The stash comes from LSTMTraining on the same inputs (with B, which LSTMGrad does not take).
        import ortlstm.reference

        forward = ortlstm.reference.lstm_training(
            {name: values.get(name) for name in spec.inputs}, hidden_size=spec.dims[3], **spec.attributes
        )
        values.update({name: forward[name] for name in _STASH})
    inputs = [values[value.name] for value in model.graph.input]
    feeds = {value.name: values[value.name] for value in model.graph.input}
    outputs = _reference_session(model).run(None, feeds)
    return model, inputs, [np.asarray(output) for output in outputs]


def generate(directory: str | Path) -> list[Path]:
    """Writes every case (``SPECS`` x float32, float64) under ``directory``, replacing old ones.

    Returns:
        The case directories written.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob(f"{CASE_PREFIX}*"):
        shutil.rmtree(old)
    written = []
    for spec in SPECS:
        for dtype in _ELEM_TYPES:
            model, inputs, outputs = generate_case(spec, dtype)
            case_dir = root / case_name(spec, dtype)
            data_dir = case_dir / DATA_SET
            data_dir.mkdir(parents=True)
            onnx.save(model, str(case_dir / "model.onnx"))
            for kind, values, infos in (("input", inputs, model.graph.input), ("output", outputs, model.graph.output)):
                for k, (value, info) in enumerate(zip(values, infos, strict=True)):
                    tensor = onnx.numpy_helper.from_array(value, info.name)
                    (data_dir / f"{kind}_{k}.pb").write_bytes(tensor.SerializeToString())
            written.append(case_dir)
    return written


# ---------------------------------------------------------------------------------------------
# Loading and running


@dataclasses.dataclass(frozen=True)
class Case:
    """One case read from disk."""

    name: str
    model: onnx.ModelProto
    inputs: list[np.ndarray]  # in graph input order
    outputs: list[np.ndarray]  # expected, in graph output order

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        """Graph input name -> value."""
        return {info.name: value for info, value in zip(self.model.graph.input, self.inputs, strict=True)}


def _read_tensors(directory: Path, kind: str) -> list[np.ndarray]:
    files = sorted(directory.glob(f"{kind}_*.pb"), key=lambda path: int(path.stem.split("_")[-1]))
    return [onnx.numpy_helper.to_array(onnx.TensorProto.FromString(path.read_bytes())) for path in files]


def load_cases(directory: str | Path) -> list[Case]:
    """Every case under ``directory`` (directories named ``test_ortlstm_*``), sorted by name.

    Raises:
        FileNotFoundError: If the directory holds no case.
    """
    root = Path(directory)
    case_dirs = sorted(path for path in root.glob(f"{CASE_PREFIX}*") if path.is_dir())
    if not case_dirs:
        raise FileNotFoundError(
            f"no conformance cases ({CASE_PREFIX}*) in {root}; write them with `python -m ortlstm.conformance "
            f"generate {root}`"
        )
    return [
        Case(
            path.name,
            onnx.load(str(path / "model.onnx")),
            _read_tensors(path / DATA_SET, "input"),
            _read_tensors(path / DATA_SET, "output"),
        )
        for path in case_dirs
    ]


class ReferenceBackend(onnx.backend.base.Backend):
    """``onnx.reference.ReferenceEvaluator`` with ``ortlstm.reference.OPS``, as an onnx backend."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> onnx.backend.base.BackendRep:
        """A representation that runs ``model`` in the reference evaluator."""
        return _SessionRep(_reference_session(model), [value.name for value in model.graph.input])

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """CPU only."""
        return device == "CPU"


class OnnxruntimeBackend(onnx.backend.base.Backend):
    """onnxruntime's CPU provider with the ortlstm kernel library, as an onnx backend."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> onnx.backend.base.BackendRep:
        """A representation that runs ``model`` in an onnxruntime session."""
        import onnxruntime

        session = onnxruntime.InferenceSession(
            model.SerializeToString(), ortlstm.ops.session_options(), providers=["CPUExecutionProvider"]
        )
        return _SessionRep(session, [value.name for value in model.graph.input])

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """CPU only."""
        return device == "CPU"


class _SessionRep(onnx.backend.base.BackendRep):
    def __init__(self, session: Any, input_names: list[str]) -> None:
        self._session = session
        self._input_names = input_names

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        feeds = inputs if isinstance(inputs, Mapping) else dict(zip(self._input_names, inputs, strict=True))
        return tuple(self._session.run(None, dict(feeds)))


BACKENDS: dict[str, type[onnx.backend.base.Backend]] = {
    "onnxruntime": OnnxruntimeBackend,
    "reference": ReferenceBackend,
}


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """The outcome of one case on one backend; ``message`` says what differed, "" when passed."""

    name: str
    passed: bool
    message: str = ""


def compare(case: Case, actual: Sequence[Any]) -> str:
    """Checks a backend's outputs against the case's; returns "" or what differs."""
    if len(actual) != len(case.outputs):
        return f"expected {len(case.outputs)} outputs, got {len(actual)}"
    problems = []
    for info, expected, value in zip(case.model.graph.output, case.outputs, actual, strict=True):
        value = np.asarray(value)
        if value.dtype != expected.dtype or value.shape != expected.shape:
            problems.append(
                f"{info.name}: expected {expected.dtype}{list(expected.shape)}, got {value.dtype}{list(value.shape)}"
            )
            continue
        rtol, atol = TOLERANCES[expected.dtype.name]
        try:
            np.testing.assert_allclose(value, expected, rtol=rtol, atol=atol, err_msg=info.name)
        except AssertionError as error:
            problems.append(str(error).strip())
    return "\n".join(problems)


def _resolve_backend(backend: str | type[onnx.backend.base.Backend] | onnx.backend.base.Backend) -> Any:
    if isinstance(backend, str):
        if backend in BACKENDS:
            return BACKENDS[backend]
        module_name, _, class_name = backend.partition(":")
        if not class_name:
            raise ValueError(f"backend {backend!r}: expected one of {sorted(BACKENDS)} or 'module:Class'")
        return getattr(importlib.import_module(module_name), class_name)
    return backend


def run(
    backend: str | type[onnx.backend.base.Backend] | onnx.backend.base.Backend,
    directory: str | Path,
    *,
    device: str = "CPU",
) -> list[CaseResult]:
    """Runs every case under ``directory`` on ``backend`` and compares with the expected outputs.

    Args:
        backend: ``"onnxruntime"``, ``"reference"``, ``"module:Class"`` or an
            ``onnx.backend.base.Backend`` (class or instance); its ``prepare(model, device)``
            returns a rep whose ``run(inputs)`` takes the inputs in graph order.
        directory: Where the cases are (``generate`` writes them).
        device: Passed to ``prepare``.

    Returns:
        One result per case; a case that raises fails with the exception's message.
    """
    resolved = _resolve_backend(backend)
    results = []
    for case in load_cases(directory):
        try:
            rep = resolved.prepare(case.model, device)
            message = compare(case, rep.run(case.inputs))
        except Exception as error:  # a backend's failure is the case's result
            message = f"{type(error).__name__}: {error}"
        results.append(CaseResult(case.name, not message, message))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """``generate DIR`` or ``run DIR [--backend ...]``; exits 1 if a case fails."""
    parser = argparse.ArgumentParser(prog="python -m ortlstm.conformance", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    generate_parser = commands.add_parser("generate", help="write the cases from the reference")
    generate_parser.add_argument("directory", type=Path)
    run_parser = commands.add_parser("run", help="run the cases on a backend")
    run_parser.add_argument("directory", type=Path)
    run_parser.add_argument(
        "--backend", default="onnxruntime", help="onnxruntime, reference, or module:Class of an onnx Backend"
    )
    args = parser.parse_args(argv)
    if args.command == "generate":
        written = generate(args.directory)
        print(f"wrote {len(written)} cases to {args.directory}")
        return 0
    results = run(args.backend, args.directory)
    failed = [result for result in results if not result.passed]
    for result in failed:
        print(f"FAIL {result.name}\n  " + result.message.replace("\n", "\n  "))
    print(f"{len(results) - len(failed)} of {len(results)} cases passed on {args.backend}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
