"""Conformance cases of the ortlstm domain: generated from the reference, run against any backend.

Role in the flow: the op contract as data another implementation can be checked against. Each case
is a directory in ONNX's node-test layout (as ``onnx/backend/test/data/node/test_*``)::

    <case>/model.onnx                   one LSTMTraining or LSTMGrad node, or LSTMTraining -> LSTMGrad
                                        (the GRU's and RNN's cases likewise)
    <case>/test_data_set_0/input_<k>.pb  TensorProto of graph input k, named as the input
    <case>/test_data_set_0/output_<k>.pb TensorProto of graph output k, named as the output

The expected outputs are computed by ``ortlstm.reference`` through ``onnx.reference``'s
``ReferenceEvaluator``. The cases cover every attribute, float32 and float64, both layouts,
sequence_lens with zeros, omitted optional inputs and outputs, T=1 and batch 1, the 12-input form
of LSTMGrad that com.microsoft's LSTMGrad takes, and LSTMGrad fed by LSTMTraining in one graph;
and the same for GRUTraining / GRUGrad (``GRU_SPECS``: linear_before_reset 0 and 1, com.microsoft
GRUGrad's ten inputs) and RNNTraining / RNNGrad (``RNN_SPECS``: Tanh, Relu, ScaledTanh, clip). The
cases themselves are data in ``ortlstm.conformance_specs``.
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
from ortlstm.conformance_specs import (  # noqa: F401 - CaseSpec, SPECS and the families are this module's API
    FAMILIES,
    GRU_SPECS,
    LSTM_SPECS,
    RNN_SPECS,
    SPECS,
    CaseSpec,
    Family,
)
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
    family = spec.family
    shapes = {**{name: _port_shape(port, spec) for name, port in _ports(family.training).items()}}
    shapes.update({name: _port_shape(port, spec) for name, port in _ports(family.grad).items()})
    if spec.grad != "node":
        forward_outputs = family.forward_outputs if spec.grad == "chained" else spec.outputs
        nodes.append(
            ortlstm.ops.make_node(
                family.training.name,
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
                family.grad.name,
                {name: name for name in spec.grad_inputs},
                {name: name for name in spec.grad_outputs},
                name="grad",
                **attributes,
            )
        )
        produced = set(family.forward_outputs) if spec.grad == "chained" else set()
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
    family = spec.family
    ports = _ports(family.training) | _ports(family.grad)
    for name in (*family.forward_inputs, *family.upstream_gradients):
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
        # The stash comes from the forward op on the same inputs (with B, which LSTMGrad does not take).
        module, function = spec.family.stash_from.split(":")
        forward = getattr(importlib.import_module(module), function)(
            {name: values.get(name) for name in spec.inputs}, hidden_size=spec.dims[3], **spec.attributes
        )
        values.update({name: forward[name] for name in spec.family.stash})
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
