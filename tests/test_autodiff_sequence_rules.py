"""Sequence ops on a parameter's path: resolved by prepare_model, gradients against finite differences.

Each row is a small graph written with onnx.helper the way torch's dynamo exporter writes
torch.split / torch.chunk with ``optimize=False`` (SplitToSequence read by SequenceAt at positions
held in Constant nodes), or with the other sequence ops (SequenceConstruct, SequenceEmpty,
SequenceInsert, SequenceErase, SequenceLength, ConcatFromSequence). The oracle is the original
graph, sequence ops and all, run by onnxruntime: central differences of its loss in float64
(tests/gradcheck.py's ``numeric_gradients``) against the gradient built from the prepared graph,
and float32 gradients (graph optimizations on and off) against the float64 ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from gradcheck import (
    FLOAT32_RTOL,
    FLOAT64_ATOL,
    FLOAT64_RTOL,
    IR_VERSION,
    _Built,
    analytic_gradients,
    numeric_gradients,
)
from onnx import TensorProto, helper, numpy_helper

import ortlstm.ops
from ortlstm.graphs import TrainingModels, build_training_models, losses, optimizers, prepare_model
from ortlstm.graphs.autodiff import GraphEmitter, build_backward, infer_value_types, onnx_opset
from ortlstm.graphs.emit.emitter import used_names
from ortlstm.graphs.prepare.sequences import SEQUENCE_OPS

_RNG = np.random.default_rng(41)
_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def _ints(name: str, value: int | Sequence[int]) -> onnx.NodeProto:
    """An int64 Constant node, as torch writes split sizes and positions."""
    array = np.asarray(value, dtype=np.int64)
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))


def _at(sequence: str, position: int, output: str) -> list[onnx.NodeProto]:
    return [
        _ints(f"{output}_position", position),
        helper.make_node("SequenceAt", [sequence, f"{output}_position"], [output]),
    ]


@dataclasses.dataclass(frozen=True)
class SequenceCase:
    """A graph computing ``y`` from float inputs, differentiated with respect to all of them.

    Attributes:
        id: Test id.
        nodes: The graph's nodes (``y`` is the value the loss weighs).
        inputs: Input name -> value (float64; cast per test dtype).
        shapes: Declared input shapes where not the value's (symbolic dims), by name.
        opset: The ai.onnx opset.
    """

    id: str
    nodes: tuple[onnx.NodeProto, ...]
    inputs: dict[str, np.ndarray]
    shapes: dict[str, list[int | str]] = dataclasses.field(default_factory=dict)
    opset: int = 20


def _forward(case: SequenceCase, dtype: np.dtype) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The case's graph with loss = sum(y * weight), and its feeds (weight a random constant)."""
    feeds = {name: value.astype(dtype) for name, value in case.inputs.items()}
    elem = _ELEM[np.dtype(dtype)]
    inputs = [
        helper.make_tensor_value_info(name, elem, case.shapes.get(name, list(value.shape)))
        for name, value in feeds.items()
    ]

    def model(nodes: list[onnx.NodeProto], outputs: list[onnx.ValueInfoProto], inits: list) -> onnx.ModelProto:
        graph = helper.make_graph(nodes, case.id, inputs, outputs, inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)], ir_version=IR_VERSION)

    probe = model(list(case.nodes), [helper.make_empty_tensor_value_info("y")], [])
    (y,) = ort.InferenceSession(probe.SerializeToString()).run(None, feeds)
    rng = np.random.default_rng(0)
    weight = (rng.uniform(0.5, 1.5, y.shape) * rng.choice([-1, 1], y.shape)).astype(dtype)
    loss_nodes = [
        helper.make_node("Mul", ["y", "weight"], ["weighted"]),
        helper.make_node("ReduceSum", ["weighted"], ["loss"], keepdims=0),
    ]
    return (
        model(
            [*case.nodes, *loss_nodes],
            [helper.make_tensor_value_info("loss", elem, [])],
            [numpy_helper.from_array(weight, "weight")],
        ),
        feeds,
    )


def _build(case: SequenceCase, dtype: type = np.float64) -> _Built:
    """The original forward model (the oracle) and the prepared one with gradients."""
    forward, feeds = _forward(case, np.dtype(dtype))
    with_gradients = prepare_model(forward).model
    left = [node.op_type for node in with_gradients.graph.node if node.op_type in SEQUENCE_OPS]
    assert not left, f"{case.id}: sequence ops left after prepare_model: {left}"
    emitter = GraphEmitter(
        onnx_opset(with_gradients), used_names(with_gradients.graph), infer_value_types(with_gradients)
    )
    emitter.record_constants(with_gradients.graph.initializer)
    wrt = list(case.inputs)
    result = build_backward(with_gradients.graph, "loss", wrt, emitter)
    with_gradients.graph.node.extend(emitter.nodes)
    with_gradients.graph.initializer.extend(emitter.initializers)
    for name in wrt:
        with_gradients.graph.output.append(helper.make_empty_tensor_value_info(result.gradients[name]))
    return _Built(forward, with_gradients, feeds, wrt)


def _r(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape)


CASES = [
    # torch.split(x, [2, 3, 2], dim=1): a 1-D split, every piece read
    SequenceCase(
        "split_sizes",
        (
            _ints("sizes", [2, 3, 2]),
            helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=1, keepdims=1),
            *_at("parts", 0, "a"),
            *_at("parts", 1, "b"),
            *_at("parts", 2, "c"),
            helper.make_node("Sub", ["a", "c"], ["ac"]),
            helper.make_node("Tanh", ["b"], ["tb"]),
            helper.make_node("Concat", ["ac", "tb"], ["y"], axis=1),
        ),
        {"x": _r(2, 7)},
    ),
    # the same with a dynamic batch (the split axis static), in opset 13 (Split sizes an input)
    SequenceCase(
        "split_sizes_dynamic_batch_opset13",
        (
            _ints("sizes", [2, 3, 2]),
            helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=-1),
            *_at("parts", -1, "c"),
            *_at("parts", 1, "b"),
            helper.make_node("Sigmoid", ["b"], ["sb"]),
            helper.make_node("Concat", ["c", "sb"], ["y"], axis=1),
        ),
        {"x": _r(3, 7)},
        shapes={"x": ["batch", 7]},
        opset=13,
    ),
    # torch.chunk(x, 3, dim=1) on 7 columns: a scalar split 3 (pieces 3, 3, 1); one piece read twice,
    # one not at all; negative positions
    SequenceCase(
        "chunk_scalar_split",
        (
            _ints("chunk", 3),
            helper.make_node("SplitToSequence", ["x", "chunk"], ["parts"], axis=1),
            *_at("parts", 0, "p"),
            *_at("parts", -3, "p_again"),
            *_at("parts", -1, "r"),
            helper.make_node("Mul", ["p", "p_again"], ["pp"]),
            helper.make_node("Mul", ["pp", "r"], ["y"]),
        ),
        {"x": _r(2, 7)},
        shapes={"x": ["batch", 7]},
    ),
    # no split: pieces of 1, squeezed with keepdims=0 (an unbind), along a middle axis
    SequenceCase(
        "no_split_keepdims0",
        (
            helper.make_node("SplitToSequence", ["x"], ["rows"], axis=1, keepdims=0),
            *_at("rows", 0, "u0"),
            *_at("rows", 2, "u2"),
            helper.make_node("Sub", ["u0", "u2"], ["y"]),
        ),
        {"x": _r(2, 3, 4)},
    ),
    SequenceCase(
        "no_split_keepdims1_negative_axis",
        (
            helper.make_node("SplitToSequence", ["x"], ["columns"], axis=-1),
            *_at("columns", 1, "k1"),
            *_at("columns", 3, "k3"),
            helper.make_node("Sub", ["k1", "k3"], ["y"]),
        ),
        {"x": _r(2, 3, 4)},
    ),
    # a parameter reaches the sequence twice: through two reads and a ConcatFromSequence
    SequenceCase(
        "split_read_and_concatenated",
        (
            _ints("sizes", [1, 3]),
            helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=0),
            *_at("parts", 1, "tail"),
            helper.make_node("ConcatFromSequence", ["parts"], ["whole"], axis=0),
            helper.make_node("Tanh", ["whole"], ["tw"]),
            helper.make_node("Concat", ["tw", "tail"], ["y"], axis=0),
        ),
        {"x": _r(4, 3)},
    ),
    # the split axis dynamic: torch.chunk(x, 2, dim=1) writes a run-time chunk size, ceil(width / 2)
    SequenceCase(
        "chunk_run_time_size_dynamic_axis",
        (
            _ints("axis1", [1]),
            _ints("one", 1),
            _ints("two", 2),
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Gather", ["shape", "axis1"], ["width_1d"]),
            helper.make_node("Squeeze", ["width_1d"], ["width"]),
            helper.make_node("Add", ["width", "two"], ["width_plus_two"]),
            helper.make_node("Sub", ["width_plus_two", "one"], ["rounded"]),
            helper.make_node("Div", ["rounded", "two"], ["chunk"]),
            helper.make_node("SplitToSequence", ["x", "chunk"], ["halves"], axis=1),
            *_at("halves", 0, "first"),
            *_at("halves", 1, "second"),
            helper.make_node("Tanh", ["first"], ["t"]),
            helper.make_node("Mul", ["t", "second"], ["y"]),
        ),
        {"x": _r(2, 8)},
        shapes={"x": ["batch", "width"]},
    ),
    # torch.split(x, 2, dim=1) on a dynamic axis: a constant chunk, positions from the front and the back
    SequenceCase(
        "constant_chunk_dynamic_axis_negative_positions",
        (
            _ints("chunk", 2),
            helper.make_node("SplitToSequence", ["x", "chunk"], ["parts"], axis=1),
            *_at("parts", 1, "second"),
            *_at("parts", -1, "last"),
            *_at("parts", -2, "before_last"),
            helper.make_node("Mul", ["second", "last"], ["product"]),
            helper.make_node("Concat", ["product", "before_last"], ["y"], axis=1),
        ),
        {"x": _r(2, 7)},  # pieces 2, 2, 2, 1: the last one shorter
        shapes={"x": ["batch", "width"]},
    ),
    SequenceCase(
        "no_split_keepdims0_dynamic_axis",
        (
            helper.make_node("SplitToSequence", ["x"], ["rows"], axis=0, keepdims=0),
            *_at("rows", 0, "r0"),
            *_at("rows", -1, "r_last"),
            helper.make_node("Sub", ["r0", "r_last"], ["y"]),
        ),
        {"x": _r(4, 3)},
        shapes={"x": ["rows", 3]},
    ),
    # run-time sizes of a static count: [width - 2, 2]
    SequenceCase(
        "run_time_sizes_static_count",
        (
            _ints("axis1", [1]),
            _ints("two", [2]),
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Gather", ["shape", "axis1"], ["width"]),
            helper.make_node("Sub", ["width", "two"], ["head"]),
            helper.make_node("Concat", ["head", "two"], ["sizes"], axis=0),
            helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=1),
            *_at("parts", 1, "tail"),
            *_at("parts", 0, "front"),
            helper.make_node("ReduceSum", ["front", "axis1"], ["front_sum"], keepdims=1),
            helper.make_node("Mul", ["tail", "front_sum"], ["y"]),
        ),
        {"x": _r(3, 6)},
        shapes={"x": ["batch", "width"]},
    ),
    # SequenceConstruct read by ConcatFromSequence, without and with new_axis
    SequenceCase(
        "construct_concat",
        (
            helper.make_node("Tanh", ["x"], ["tx"]),
            helper.make_node("SequenceConstruct", ["tx", "z", "x"], ["items"]),
            helper.make_node("ConcatFromSequence", ["items"], ["y"], axis=1),
        ),
        {"x": _r(2, 3), "z": _r(2, 2)},
    ),
    SequenceCase(
        "construct_stack_new_axis",
        (
            helper.make_node("Sigmoid", ["x"], ["sx"]),
            helper.make_node("SequenceConstruct", ["sx", "z"], ["items"]),
            helper.make_node("ConcatFromSequence", ["items"], ["stacked"], axis=-1, new_axis=1),
            *_at("items", 1, "second"),
            _ints("last_axis", [-1]),
            helper.make_node("Unsqueeze", ["second", "last_axis"], ["second_column"]),
            helper.make_node("Mul", ["stacked", "second_column"], ["y"]),
        ),
        {"x": _r(2, 3), "z": _r(2, 3)},
    ),
    # SequenceEmpty, SequenceInsert (appended, at 0, at -1), SequenceErase, SequenceLength
    SequenceCase(
        "empty_insert_erase_length",
        (
            helper.make_node("SequenceEmpty", [], ["empty"], dtype=TensorProto.DOUBLE),
            helper.make_node("SequenceInsert", ["empty", "x"], ["s1"]),
            _ints("front", 0),
            helper.make_node("SequenceInsert", ["s1", "z", "front"], ["s2"]),  # [z, x]
            helper.make_node("Tanh", ["x"], ["tx"]),
            _ints("before_last", -1),
            helper.make_node("SequenceInsert", ["s2", "tx", "before_last"], ["s3"]),  # [z, tx, x]
            helper.make_node("SequenceErase", ["s3"], ["s4"]),  # [z, tx]
            helper.make_node("ConcatFromSequence", ["s4"], ["joined"], axis=0),
            helper.make_node("SequenceLength", ["s4"], ["count"]),
            helper.make_node("CastLike", ["count", "joined"], ["count_float"]),
            helper.make_node("Mul", ["joined", "count_float"], ["y"]),
        ),
        {"x": _r(2, 3), "z": _r(1, 3)},
    ),
]


def _with_dtype(case: SequenceCase, dtype: type) -> SequenceCase:
    """SequenceEmpty's dtype attribute follows the test dtype."""
    nodes = []
    for node in case.nodes:
        if node.op_type == "SequenceEmpty":
            node = helper.make_node("SequenceEmpty", [], list(node.output), dtype=_ELEM[np.dtype(dtype)])
        nodes.append(node)
    return dataclasses.replace(case, nodes=tuple(nodes))


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_sequence_gradient_matches_finite_differences(case: SequenceCase) -> None:
    built = _build(case)
    (loss,) = built.session(built.forward).run(None, built.feeds)
    assert built.session(built.with_gradients).run(["loss"], built.feeds)[0] == pytest.approx(float(loss), abs=1e-12)
    analytic, numeric = analytic_gradients(built), numeric_gradients(built)
    for name in built.wrt_names:
        np.testing.assert_allclose(
            analytic[name], numeric[name], rtol=FLOAT64_RTOL, atol=FLOAT64_ATOL, err_msg=f"{case.id}: d loss / d {name}"
        )


@pytest.mark.parametrize("optimize", [False, True], ids=["opt_off", "opt_on"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_sequence_gradient_float32(case: SequenceCase, optimize: bool) -> None:
    reference = analytic_gradients(_build(case))
    got = analytic_gradients(_build(_with_dtype(case, np.float32), np.float32), optimize)
    for name, expected in reference.items():
        assert got[name].dtype == np.float32
        scale = max(float(np.max(np.abs(expected))), 1.0)
        np.testing.assert_allclose(got[name], expected, rtol=0, atol=FLOAT32_RTOL * scale, err_msg=f"{case.id}: {name}")


def test_run_time_position_is_refused_with_advice() -> None:
    """A SequenceAt at a position fed at run time stays a sequence read; on the path it is named, with advice."""
    nodes = [
        _ints("sizes", [2, 5]),
        helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=1),
        helper.make_node("SequenceAt", ["parts", "k"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "run_time_position",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 7]),
            helper.make_tensor_value_info("k", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=IR_VERSION)
    prepared = prepare_model(model).model
    assert "SequenceAt" in {node.op_type for node in prepared.graph.node}
    emitter = GraphEmitter(onnx_opset(prepared), used_names(prepared.graph), infer_value_types(prepared))
    # SplitToSequence has no rule either: one refusal names both, the advice once.
    message = (
        r"no gradient rule for 2 op\(s\) in 2 nodes.*\n.*SplitToSequence.*must be constants.*\n"
        r"  ai\.onnx::SequenceAt node \(unnamed\) computing 'y', on the path of parameter\(s\) \['x'\]: as for"
    )
    with pytest.raises(ValueError, match=message):
        build_backward(prepared.graph, "loss", ["x"], emitter)


def test_fixed_shapes_make_a_dynamic_chunk_one_split() -> None:
    """A chunked dynamic axis is read piece by piece (Slice); fixing its extent gives one Split instead."""
    chunked = next(case for case in CASES if case.id == "chunk_scalar_split")
    forward, _ = _forward(dataclasses.replace(chunked, shapes={"x": ["batch", "width"]}), np.dtype(np.float64))
    dynamic = [node.op_type for node in prepare_model(forward).model.graph.node]
    assert "Split" not in dynamic
    assert dynamic.count("Slice") == 3
    fixed = [node.op_type for node in prepare_model(forward, fixed_shapes={"x": [None, 7]}).model.graph.node]
    assert fixed.count("Split") == 1
    assert "Slice" not in fixed


# ---- end to end: torch.split / torch.chunk / torch.unbind exported with dynamo, optimize=False ----

EXPORTED = Path(__file__).parent / "data" / "split_chunk_unbind_dynamo_opt_off.onnx"
"""``export_split_chunk_unbind(torch)`` as torch 2.13 wrote it (float64, dynamic batch), node metadata stripped."""


def export_split_chunk_unbind(torch: Any) -> onnx.ModelProto:
    """A Linear(4, 7) whose output is cut by torch.split, torch.chunk and torch.unbind, exported in float64.

    ``torch.onnx.export(..., dynamo=True, optimize=False)``; the batch dim stays dynamic. Node
    metadata (the exporter's stack traces) is stripped to keep the file small.
    """

    class SplitChunkUnbind(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 7)

        def forward(self, x: Any) -> Any:
            h = self.linear(x)
            a, b, c = torch.split(h, [2, 3, 2], dim=1)
            p, q, r = torch.chunk(h, 3, dim=1)
            u = torch.unbind(h, dim=1)
            s = torch.split(h, 3, dim=1)
            pieces = [torch.sigmoid(a) * c, torch.tanh(b[:, :2]) - p[:, 1:], q * s[-1], r + (u[0] * u[6]).unsqueeze(1)]
            return torch.cat(pieces, dim=1)

    torch.manual_seed(0)
    module = SplitChunkUnbind().double()
    program = torch.onnx.export(
        module,
        (torch.randn(3, 4, dtype=torch.float64),),
        dynamo=True,
        optimize=False,
        input_names=["x"],
        output_names=["y"],
        dynamic_shapes=({0: torch.export.Dim("batch")},),
    )
    model = program.model_proto
    for node in model.graph.node:
        node.ClearField("metadata_props")
        node.doc_string = ""
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info, *model.graph.initializer]:
        value.ClearField("metadata_props")
    model.ClearField("metadata_props")
    return model


def _batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {"x": rng.standard_normal((5, 4)), "target": rng.standard_normal((5, 8))}


def _train(model: onnx.ModelProto) -> TrainingModels:
    return build_training_models(model, loss=losses.Loss.mse_loss(), optimizer=optimizers.SGD(lr=0.1))


def _loss_and_gradients(built: TrainingModels, params: dict[str, np.ndarray]) -> tuple[float, dict[str, np.ndarray]]:
    names = [output.name for output in built.gradients.graph.output]
    values = dict(zip(names, _session(built.gradients).run(None, {**_batch(), **params}), strict=True))
    signature = built.signature
    return float(values[signature.loss]), {name: values[signature.grads[name]] for name in signature.params}


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(
        model.SerializeToString(), ortlstm.ops.session_options(), providers=["CPUExecutionProvider"]
    )


def test_exported_split_chunk_unbind_gradient_matches_finite_differences() -> None:
    """The saved export (SplitToSequence + SequenceAt) builds; its gradient is central differences of its loss."""
    model = onnx.load(EXPORTED)
    assert {"SplitToSequence", "SequenceAt"} <= {node.op_type for node in model.graph.node}
    built = _train(model)
    signature = built.signature
    loss_only = onnx.ModelProto()
    loss_only.CopyFrom(built.eval)
    kept = [output for output in loss_only.graph.output if output.name == signature.loss]
    del loss_only.graph.output[:]
    loss_only.graph.output.extend(kept)
    outputs = [output.name for output in built.gradients.graph.output]
    assert outputs == [signature.loss, *(signature.grads[name] for name in signature.params)]
    check = _Built(loss_only, built.gradients, {**_batch(), **built.initial_params}, list(signature.params))
    analytic, numeric = analytic_gradients(check), numeric_gradients(check)
    for name in signature.params:
        np.testing.assert_allclose(analytic[name], numeric[name], rtol=FLOAT64_RTOL, atol=FLOAT64_ATOL, err_msg=name)


def test_exported_split_chunk_unbind_trains() -> None:
    """Twenty SGD steps of the train-step model lower the loss of a fixed batch (measured: by 40 %)."""
    built = _train(onnx.load(EXPORTED))
    signature = built.signature
    step = _session(built.train_step)
    params = dict(built.initial_params)
    first, _ = _loss_and_gradients(built, params)
    for count in range(1, 21):
        feeds = {**_batch(), **params, signature.lr: np.asarray(0.1), signature.step: np.asarray(count, np.int64)}
        outputs = dict(zip([o.name for o in built.train_step.graph.output], step.run(None, feeds), strict=True))
        params = {name: outputs[new] for name, new in zip(signature.params, signature.new_params, strict=True)}
    last, _ = _loss_and_gradients(built, params)
    assert last < 0.75 * first, f"loss {first:.4f} -> {last:.4f}"


def test_torch_split_chunk_unbind_gradient_is_torchs() -> None:
    """Exported now with this torch: still sequence ops (as the saved file), and the gradient is torch autograd's."""
    torch = pytest.importorskip("torch")
    model = export_split_chunk_unbind(torch)
    saved = onnx.load(EXPORTED)
    assert [node.op_type for node in model.graph.node] == [node.op_type for node in saved.graph.node]
    built = _train(model)
    loss, grads = _loss_and_gradients(built, built.initial_params)

    params = {name: torch.from_numpy(value).requires_grad_() for name, value in built.initial_params.items()}
    x, target = (torch.from_numpy(value) for value in _batch().values())
    h = torch.nn.functional.linear(x, params["linear.weight"], params["linear.bias"])
    a, b, c = torch.split(h, [2, 3, 2], dim=1)
    p, q, r = torch.chunk(h, 3, dim=1)
    u = torch.unbind(h, dim=1)
    s = torch.split(h, 3, dim=1)
    y = torch.cat([torch.sigmoid(a) * c, torch.tanh(b[:, :2]) - p[:, 1:], q * s[-1], r + (u[0] * u[6]).unsqueeze(1)], 1)
    expected = torch.nn.functional.mse_loss(y, target)
    expected.backward()
    assert loss == pytest.approx(float(expected), rel=1e-12)
    for name, tensor in params.items():
        np.testing.assert_allclose(grads[name], tensor.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
