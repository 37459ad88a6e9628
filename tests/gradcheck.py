"""Checks gradient rules against central finite differences, running both sides in onnxruntime.

A ``Case`` is one forward node with its inputs. ``check_case`` builds a model computing
``loss = sum_k sum(output_k * weight_k)`` over the node's float outputs (random weights, so every
output element matters), differentiates it with ``ortlstm.graphs.autodiff.build_backward`` and
compares the gradients with central differences of the same loss, in float64. The float32
variant compares float32 gradients (with graph optimizations on or off) to the float64 ones.
The oracle is the forward op as onnxruntime runs it; nothing here shares code with the rules.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnx.reference
import onnxruntime as ort
from onnx import TensorProto, helper

import ortlstm.ops
from ortlstm.graphs.autodiff import GraphEmitter, build_backward, infer_value_types, onnx_opset
from ortlstm.graphs.emit.emitter import used_names

IR_VERSION = 10  # onnxruntime-training 1.19.2 loads IR <= 10

FD_STEP = 1e-6
FLOAT64_RTOL = 1e-6
FLOAT64_ATOL = 1e-8
FLOAT32_RTOL = 2e-4
"""float32 gradients vs float64 ones: relative to the largest float64 gradient of the input."""


@dataclasses.dataclass(frozen=True)
class Input:
    """One input of the node under test.

    Attributes:
        value: The array (float64 for float inputs; cast per test dtype), or None for an omitted input.
        wrt: Differentiate with respect to it (then it is a graph input, perturbed for differences).
        initializer: A constant of the model instead of a graph input (not with ``wrt``).
        dynamic: As a graph input, declare every dim symbolic, so rules cannot rely on static shapes.
    """

    value: np.ndarray | None
    wrt: bool = False
    initializer: bool = False
    dynamic: bool = False


def wrt(value: np.ndarray | Sequence[float], *, dynamic: bool = False) -> Input:
    """A float input to differentiate with respect to."""
    return Input(np.asarray(value, dtype=np.float64), wrt=True, dynamic=dynamic)


def const(value: np.ndarray | Sequence[float] | int | float, *, dtype: type | None = None) -> Input:
    """A constant input (an initializer); float arrays follow the test dtype."""
    return Input(np.asarray(value, dtype=dtype), initializer=True)


def fed(
    value: np.ndarray | Sequence[float] | int | float, *, dtype: type | None = None, dynamic: bool = False
) -> Input:
    """An input fed at run time that is not differentiated (run-time bounds, indices, ...)."""
    return Input(np.asarray(value, dtype=dtype), dynamic=dynamic)


OMITTED = Input(None)


def clear_of(
    rng: np.random.Generator, points: Sequence[float], *shape: int, low: float = -3.0, high: float = 3.0
) -> np.ndarray:
    """Uniform values at least 0.1 away from each of ``points`` (the kinks of the op under test)."""
    values = rng.uniform(low, high, shape)
    for point in points:
        near = np.abs(values - point) < 0.1
        values[near] += np.where(values[near] >= point, 0.2, -0.2)
    return values


@dataclasses.dataclass(frozen=True)
class Case:
    """One node to differentiate.

    Attributes:
        id: Test id.
        op_type: The op.
        inputs: The node's inputs in order.
        attributes: Node attributes.
        domain: The op's domain.
        opset: The ai.onnx opset of the model.
        num_outputs: How many outputs the node has (all get names).
        loss_outputs: Indices of the outputs that enter the loss; default every float output
            (leave out outputs that carry no gradient, such as LSTMTraining's stash).
        seed: Seed of the random loss weights.
        float64_forward: For an op onnxruntime runs in float32 only (Elu, Softplus, HardSigmoid,
            InstanceNormalization): given the node, nodes that compute its outputs in float64. They
            replace the node in the float64 models after differentiation, so the rule under test
            still differentiates the op itself; the float32 check (the real kernel) confirms that
            the replacement computes the same function.
        float64_ops: For ops onnxruntime runs in float32 only whose rules also emit such ops (Conv:
            ConvTranspose and Conv): ``onnx.reference`` ``OpRun`` classes for them. The float64
            models then run in ``onnx.reference.ReferenceEvaluator`` with these classes, forward
            and gradient nodes alike; the float32 check runs everything in onnxruntime.
        ortlstm_ops: Let rules emit ortlstm ops where standard ops would also do (Conv's gradient
            as one ConvGrad node; ``GraphEmitter.ortlstm_ops``); False checks the standard-op gradient.
        float64_reference: For an op onnxruntime runs in float32 only that ``onnx.reference``
            implements (Gelu, HardSwish, Selu, ...): the float64 models run in
            ``onnx.reference.ReferenceEvaluator`` as they are (``float64_ops`` adds op classes).
    """

    id: str
    op_type: str
    inputs: tuple[Input, ...]
    attributes: Mapping[str, object] = dataclasses.field(default_factory=dict)
    domain: str = ""
    opset: int = 17
    num_outputs: int = 1
    loss_outputs: tuple[int, ...] | None = None
    seed: int = 0
    float64_forward: Callable[[onnx.NodeProto], Sequence[onnx.NodeProto]] | None = None
    float64_ops: tuple[type, ...] = ()
    ortlstm_ops: bool = True
    float64_reference: bool = False


_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def _cast(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return value.astype(dtype) if value.dtype.kind == "f" else value


def _value_info(name: str, value: np.ndarray, dynamic: bool) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    shape = [f"{name}_d{axis}" for axis in range(value.ndim)] if dynamic else list(value.shape)
    return helper.make_tensor_value_info(name, elem, shape)


def _opsets(case: Case) -> list[onnx.OperatorSetIdProto]:
    opsets = [helper.make_opsetid("", case.opset), helper.make_opsetid(ortlstm.ops.DOMAIN, ortlstm.ops.OPSET_VERSION)]
    if case.domain not in ("", "ai.onnx", ortlstm.ops.DOMAIN):
        opsets.append(helper.make_opsetid(case.domain, 1))
    return opsets


@functools.cache
def runs_opset(opset: int) -> bool:
    """Whether this onnxruntime loads models of ai.onnx ``opset`` (1.19 stops at 21; RMSNormalization is 23)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])],
        "probe",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime refuses the opset (its error types differ by version)
        return False
    return True


def _session(model: onnx.ModelProto, optimize: bool = False) -> ort.InferenceSession:
    options = ortlstm.ops.session_options()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class _ReferenceSession:
    """``onnx.reference.ReferenceEvaluator`` behind the ``run`` of an InferenceSession."""

    def __init__(self, model: onnx.ModelProto, ops: Sequence[type]) -> None:
        self._evaluator = onnx.reference.ReferenceEvaluator(model, new_ops=list(ops))

    def run(self, outputs: None, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(value) for value in self._evaluator.run(outputs, dict(feeds))]


@dataclasses.dataclass
class _Built:
    forward: onnx.ModelProto  # outputs: loss
    with_gradients: onnx.ModelProto  # outputs: loss, then one gradient per wrt input
    feeds: dict[str, np.ndarray]
    wrt_names: list[str]
    reference_ops: tuple[type, ...] = ()  # run in onnx.reference with these ops instead of onnxruntime
    reference: bool = False  # run in onnx.reference (with reference_ops, if any)

    def session(self, model: onnx.ModelProto, optimize: bool = False) -> ort.InferenceSession | _ReferenceSession:
        if self.reference:
            return _ReferenceSession(model, self.reference_ops)
        return _session(model, optimize)


def build(case: Case, dtype: type = np.float64) -> _Built:
    """The forward-loss model and the model with gradients, and their feeds."""
    dtype_ = np.dtype(dtype)
    names = [f"in{index}" if item.value is not None else "" for index, item in enumerate(case.inputs)]
    graph_inputs, initializers, feeds = [], [], {}
    for name, item in zip(names, case.inputs, strict=True):
        if item.value is None:
            continue
        value = _cast(item.value, dtype_)
        if item.initializer:
            initializers.append(onnx.numpy_helper.from_array(value, name))
        else:
            graph_inputs.append(_value_info(name, value, item.dynamic))
            feeds[name] = value
    outputs = [f"out{k}" for k in range(case.num_outputs)]
    node = helper.make_node(case.op_type, names, outputs, name="under_test", domain=case.domain, **case.attributes)
    substitute = case.float64_forward if dtype_ == np.float64 else None

    # Probe run: the outputs' types and shapes, for the loss weights.
    probe = helper.make_model(
        helper.make_graph(
            list(substitute(node)) if substitute else [node],
            "probe",
            graph_inputs,
            [helper.make_empty_tensor_value_info(o) for o in outputs],
            initializers,
        ),
        opset_imports=_opsets(case),
        ir_version=IR_VERSION,
    )
    reference_ops = case.float64_ops if dtype_ == np.float64 else ()
    reference = dtype_ == np.float64 and (bool(case.float64_ops) or case.float64_reference)
    values = (_ReferenceSession(probe, reference_ops) if reference else _session(probe)).run(None, feeds)
    rng = np.random.default_rng(case.seed)
    loss_nodes, terms, seeds = [], [], {}
    loss_dtype = dtype_
    for index, (output, value) in enumerate(zip(outputs, values, strict=True)):
        if value.dtype.kind != "f" or (case.loss_outputs is not None and index not in case.loss_outputs):
            continue
        weight = f"weight_{output}"
        # np.asarray: for a 0-D output numpy gives a scalar, which onnxruntime does not take as a feed.
        feeds[weight] = np.asarray(rng.uniform(0.5, 1.5, value.shape) * rng.choice([-1, 1], value.shape), value.dtype)
        graph_inputs.append(_value_info(weight, feeds[weight], False))
        loss_nodes.append(helper.make_node("Mul", [output, weight], [f"weighted_{output}"]))
        loss_nodes.append(helper.make_node("ReduceSum", [f"weighted_{output}"], [f"term_{output}"], keepdims=0))
        terms.append(f"term_{output}")
        loss_dtype = value.dtype  # not always the inputs' dtype: Cast(to=DOUBLE) of a float32 input
        # d loss / d output = weight: seeded directly, so the check relies on no rule but the one under test.
        seeds[output] = weight
    loss_nodes.append(helper.make_node("Sum", terms, ["loss"]))
    graph = helper.make_graph(
        [node, *loss_nodes],
        "forward",
        graph_inputs,
        [helper.make_tensor_value_info("loss", _ELEM[np.dtype(loss_dtype)], [])],
        initializers,
    )
    forward = helper.make_model(graph, opset_imports=_opsets(case), ir_version=IR_VERSION)

    wrt_names = [name for name, item in zip(names, case.inputs, strict=True) if item.wrt]
    with_gradients = onnx.ModelProto()
    with_gradients.CopyFrom(forward)
    emitter = GraphEmitter(
        onnx_opset(forward), used_names(forward.graph), infer_value_types(forward), ortlstm_ops=case.ortlstm_ops
    )
    emitter.record_constants(forward.graph.initializer)
    result = build_backward(with_gradients.graph, seeds, wrt_names, emitter)
    with_gradients.graph.node.extend(emitter.nodes)
    with_gradients.graph.initializer.extend(emitter.initializers)
    for name in wrt_names:
        with_gradients.graph.output.append(helper.make_empty_tensor_value_info(result.gradients[name]))
    if substitute is not None:
        for model in (forward, with_gradients):
            nodes = list(model.graph.node)  # nodes[0]: the node under test, as the rule left it
            del model.graph.node[:]
            model.graph.node.extend([*substitute(nodes[0]), *nodes[1:]])
    return _Built(forward, with_gradients, feeds, wrt_names, reference_ops, reference)


def analytic_gradients(built: _Built, optimize: bool = False) -> dict[str, np.ndarray]:
    """Each wrt input's gradient from the differentiated model."""
    values = built.session(built.with_gradients, optimize).run(None, built.feeds)
    # Copies: onnxruntime-training 1.19.2 hands back a graph output that is a graph input (a gradient
    # equal to a loss weight) as a view of the feed, which dies with ``built``.
    return {name: np.array(value, copy=True) for name, value in zip(built.wrt_names, values[1:], strict=True)}


def numeric_gradients(built: _Built, step: float = FD_STEP) -> dict[str, np.ndarray]:
    """Each wrt input's gradient by central differences of the forward loss (float64)."""
    session = built.session(built.forward)
    result = {}
    for name in built.wrt_names:
        base = built.feeds[name]
        grad = np.zeros_like(base)
        for index in np.ndindex(base.shape):
            values = []
            for sign in (1.0, -1.0):
                moved = base.copy()
                moved[index] += sign * step
                (loss,) = session.run(None, {**built.feeds, name: moved})
                values.append(float(loss))
            grad[index] = (values[0] - values[1]) / (2 * step)
        result[name] = grad
    return result


def check_case(case: Case) -> None:
    """float64 gradients equal central differences; raises AssertionError naming the input."""
    built = build(case, np.float64)
    analytic = analytic_gradients(built)
    numeric = numeric_gradients(built)
    for name in built.wrt_names:
        np.testing.assert_allclose(
            analytic[name], numeric[name], rtol=FLOAT64_RTOL, atol=FLOAT64_ATOL, err_msg=f"{case.id}: d loss / d {name}"
        )


def check_case_float32(case: Case, optimize: bool) -> None:
    """float32 gradients (graph optimizations on or off) agree with the float64 ones."""
    reference = analytic_gradients(build(case, np.float64))
    built = build(case, np.float32)
    got = analytic_gradients(built, optimize)
    for name in built.wrt_names:
        assert got[name].dtype == np.float32, f"{case.id}: d loss / d {name} is {got[name].dtype}"
        scale = max(float(np.max(np.abs(reference[name]))), 1.0)
        np.testing.assert_allclose(
            got[name], reference[name], rtol=0, atol=FLOAT32_RTOL * scale, err_msg=f"{case.id}: d loss / d {name}"
        )
