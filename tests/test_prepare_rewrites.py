"""Each rewrite of prepare_model on its own, on a small model made for it (graphs/prepare/)."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlstm.graphs.prepare import REWRITES
from ortlstm.graphs.prepare.folding import fold_constants
from ortlstm.graphs.prepare.pipeline import DECIDING_REWRITES, run_rewrites
from ortlstm.graphs.prepare.rewrites import (
    CONVERTED_OPSET,
    choose_candidates,
    convert_lstms,
    convert_old_opset,
    declare_output_shapes,
    drop_dead_values,
    drop_declared_shapes,
    drop_pow_exponents,
    fix_inputs,
    make_dynamic_dims_symbolic,
    resolve_sequences,
    untie_running_statistics,
)
from ortlstm.graphs.prepare.state import Preparation


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[str],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        [numpy_helper.from_array(value, name) for name, value in (initializers or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _x(shape: list[int | str | None]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)


def _state(model: onnx.ModelProto, **options: object) -> Preparation:
    """A preparation of a copy of ``model`` whose own initializers are its initializer names."""
    state = Preparation(model, copy.deepcopy(model), **options)  # type: ignore[arg-type]
    state.initializer_names = {init.name for init in model.graph.initializer}
    return state


def _outputs(state: Preparation) -> list[str]:
    return [name for node in state.graph.node for name in node.output]


def test_pipeline_order_and_the_probe_stops_after_folding() -> None:
    assert [rewrite.__name__ for rewrite in REWRITES] == [
        "convert_old_opset",
        "dequantize_int8",
        "make_dynamic_dims_symbolic",
        "fix_inputs",
        "drop_declared_shapes",
        "free_export_dims",
        "choose_candidates",
        "untie_merged_parameters",
        "rebuild_folded_parameters",
        "read_padding_rows",
        "warn_fused_batchnorms",
        "fold_constants",
        "resolve_sequences",
        "drop_dead_values",
        "convert_lstms",
        "convert_grus",
        "convert_rnns",
        "drop_pow_exponents",
        "untie_running_statistics",
        "declare_output_shapes",
    ]
    assert DECIDING_REWRITES[-1] is fold_constants


def test_run_rewrites_never_changes_the_model_given() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_x([-1, 2])], ["y"], {"unused": np.ones(2, np.float32)})
    before = model.SerializeToString()
    prepared = run_rewrites(model, None, None, (), REWRITES)
    assert model.SerializeToString() == before
    assert list(prepared.model.graph.initializer) == []


def test_convert_old_opset_converts_below_15_and_copies_the_rest() -> None:
    old = _model([helper.make_node("Relu", ["x"], ["y"])], [_x([2])], ["y"], opset=12)
    old.ir_version = 3
    state = _state(old)
    convert_old_opset(state)
    assert state.model.opset_import[0].version == CONVERTED_OPSET
    assert state.model.ir_version >= 8  # what opset 17 needs, not the source's 3
    assert old.opset_import[0].version == 12
    current = _model([helper.make_node("Relu", ["x"], ["y"])], [_x([2])], ["y"], opset=15)
    state = _state(current)
    convert_old_opset(state)
    assert state.model is not current
    assert state.model == current


def test_convert_old_opset_imports_a_repeated_domain_once() -> None:
    """onnx.compose.merge_models lists ai.onnx once per model merged; converting only one entry broke the graph."""
    nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0]), helper.make_node("Relu", ["u"], ["y"])]
    merged = _model(nodes, [_x([2])], ["y"], opset=12)
    merged.opset_import.extend([helper.make_opsetid("", 12), helper.make_opsetid("", 12)])
    state = _state(merged)
    convert_old_opset(state)
    assert [(entry.domain, entry.version) for entry in state.model.opset_import] == [("", CONVERTED_OPSET)]
    (unsqueeze,) = [node for node in state.model.graph.node if node.op_type == "Unsqueeze"]
    assert len(unsqueeze.input) == 2  # Unsqueeze-13: the axes an input, read at 17
    onnx.checker.check_model(state.model, full_check=True)
    assert len(merged.opset_import) == 3  # the source as it was: export writes into it
    merged.opset_import[2].version = 11
    with pytest.raises(ValueError, match=r"\(ai\.onnx at versions \[12, 12, 11\]\), which no runtime reads one way; "):
        convert_old_opset(_state(merged))


def test_make_dynamic_dims_symbolic_names_each_dim_apart() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_x([-1, 0, 3])], ["y"])
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, ["x_dim0", 1, 1]))
    state = _state(model)
    make_dynamic_dims_symbolic(state)
    dims = state.graph.input[0].type.tensor_type.shape.dim
    assert [dim.dim_param or dim.dim_value for dim in dims] == ["x_dim0_1", "x_dim1", 3]


def test_fix_inputs_makes_values_initializers_and_declares_shapes() -> None:
    inputs = [_x([None, None]), helper.make_tensor_value_info("mode", TensorProto.INT64, [])]
    model = _model([helper.make_node("Relu", ["x"], ["y"])], inputs, ["y"], {"w": np.ones(2, np.float32)})
    state = _state(model, fixed_inputs={"mode": np.int64(1)}, fixed_shapes={"x": [None, 576]})
    fix_inputs(state)
    assert [value.name for value in state.graph.input] == ["x"]
    assert [dim.dim_value for dim in state.graph.input[0].type.tensor_type.shape.dim] == [0, 576]
    assert [init.name for init in state.graph.initializer] == ["w", "mode"]
    assert state.initializer_names == {"w"}


@pytest.mark.parametrize(
    ("fixed_inputs", "fixed_shapes", "message"),
    [
        ({"z": np.int64(1)}, None, r"fixed_inputs: \['z'\] are not inputs of the model; its inputs are \['x'\]"),
        ({}, {"z": [1]}, r"fixed_shapes: \['z'\] are not inputs of the model"),
        ({}, {"x": [1]}, r"input 'x' has rank 2, the fixed shape \[1\] has 1"),
        ({}, {"x": [-1, None]}, r"input 'x' dim 0 is -1; dims are >= 0"),
        ({}, {"x": [None, 4]}, r"input 'x' dim 1 is declared 3, not 4"),
    ],
)
def test_fix_inputs_refuses_what_is_not_the_model(
    fixed_inputs: dict[str, np.ndarray], fixed_shapes: dict[str, list[int | None]] | None, message: str
) -> None:
    state = _state(
        _model([helper.make_node("Relu", ["x"], ["y"])], [_x(["n", 3])], ["y"]),
        fixed_inputs=fixed_inputs,
        fixed_shapes=fixed_shapes,
    )
    with pytest.raises(ValueError, match=message):
        fix_inputs(state)


def test_drop_declared_shapes_clears_outputs_and_value_info() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_x([2])], [])
    model.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [25]))
    model.graph.value_info.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]))
    state = _state(model)
    drop_declared_shapes(state)
    assert not state.graph.output[0].type.tensor_type.HasField("shape")
    assert list(state.graph.value_info) == []


def test_choose_candidates_takes_float_initializers_of_rank_one_or_kept() -> None:
    initializers = {
        "w": np.ones(2, np.float32),
        "eps": np.float32(1e-5),
        "scale": np.float32(2.0),
        "index": np.ones(2, np.int64),
    }
    state = _state(_model([], [_x([2])], [], initializers), kept={"scale"})
    state.graph.initializer.append(numpy_helper.from_array(np.ones(2, np.float32), "fixed"))  # a fixed input
    choose_candidates(state)
    assert state.candidates == {"w", "scale"}
    assert state.origins is None


def test_fold_constants_lifts_constants_and_folds_static_shapes() -> None:
    nodes = [
        helper.make_node("Constant", [], ["weight"], value=numpy_helper.from_array(np.arange(3, dtype=np.float32))),
        helper.make_node("Constant", [], ["zeros"], value=numpy_helper.from_array(np.zeros(4, np.float32))),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["width"], axis=0),
        helper.make_node("Size", ["shape"], ["rank"]),
        helper.make_node("Mul", ["weight", "two"], ["scaled"]),  # reads a candidate: stays
        helper.make_node("Add", ["two", "two"], ["four"]),  # constants only: folded
    ]
    model = _model(
        nodes,
        [_x(["n", 3])],
        ["scaled", "four", "zeros"],
        {"one": np.int64(1), "two": np.float32(2.0)},
    )
    state = _state(model)
    fold_constants(state)
    assert _outputs(state) == ["shape", "scaled"]  # Shape of a dynamic x stays; its reads fold
    assert state.candidates == {"weight"}  # zeros: many elements of one value, a literal
    assert state.constants["width"] == 3
    assert state.constants["rank"] == 2
    assert state.constants["four"] == 4


def test_fold_constants_replaces_an_if_by_its_branch_renaming_collisions() -> None:
    def branch(name: str, value: float) -> onnx.GraphProto:
        nodes = [helper.make_node("Add", ["x", f"c_{name}"], ["tmp"])]
        inits = [numpy_helper.from_array(np.asarray([value, -value], np.float32), f"c_{name}")]
        outputs = [helper.make_tensor_value_info("tmp", TensorProto.FLOAT, None)]
        return helper.make_graph(nodes, name, [], outputs, inits)

    nodes = [
        helper.make_node("Relu", ["x"], ["tmp"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", 1.0), else_branch=branch("else", 2.0)),
        helper.make_node("Add", ["y", "tmp"], ["z"]),
    ]
    model = _model(nodes, [_x([2])], ["z"], {"cond": np.bool_(False)})
    state = _state(model)
    fold_constants(state)
    assert [node.op_type for node in state.graph.node] == ["Relu", "Add", "Identity", "Add"]
    assert list(state.graph.node[1].output) == ["tmp_inlined"]
    assert state.specialized == [""]
    assert "c_else" in state.candidates


def test_resolve_sequences_makes_static_sequence_reads_tensor_ops() -> None:
    nodes = [
        helper.make_node("SplitToSequence", ["x", "sizes"], ["pieces"], axis=0),
        helper.make_node("SequenceAt", ["pieces", "position"], ["y"]),
    ]
    model = _model(nodes, [_x([4])], ["y"], {"sizes": np.asarray([1, 3], np.int64), "position": np.int64(1)})
    state = _state(model)
    fold_constants(state)
    resolve_sequences(state)
    drop_dead_values(state)
    assert not {"SplitToSequence", "SequenceAt"} & {node.op_type for node in state.graph.node}


def test_drop_dead_values_removes_unread_nodes_and_initializers() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Mul", ["x", "w"], ["dead"])]
    state = _state(_model(nodes, [_x([2])], ["y"], {"w": np.ones(2, np.float32)}))
    drop_dead_values(state)
    assert _outputs(state) == ["y"]
    assert list(state.graph.initializer) == []


def test_convert_lstms_names_the_lstm_training_nodes() -> None:
    hidden = 2
    weights = {
        "W": np.ones((1, 4 * hidden, 3), np.float32),
        "R": np.ones((1, 4 * hidden, hidden), np.float32),
    }
    nodes = [helper.make_node("LSTM", ["x", "W", "R"], ["", "h"], name="lstm", hidden_size=hidden)]
    state = _state(_model(nodes, [_x([5, 1, 3])], ["h"], weights))
    convert_lstms(state)
    assert [node.op_type for node in state.graph.node] == ["LSTMTraining"]
    assert state.converted == ("lstm",)


def test_drop_pow_exponents_keeps_those_the_caller_names() -> None:
    nodes = [helper.make_node("Pow", ["x", "p"], ["y"]), helper.make_node("Pow", ["x", "q"], ["z"])]
    initializers = {"p": np.full(2, 2.0, np.float32), "q": np.full(2, 3.0, np.float32)}
    state = _state(_model(nodes, [_x([2])], ["y", "z"], initializers), kept={"q"})
    state.candidates = {"p", "q"}
    drop_pow_exponents(state)
    assert state.candidates == {"q"}


def test_untie_running_statistics_copies_a_shared_initializer() -> None:
    zeros = np.zeros(2, np.float32)
    nodes = [
        helper.make_node("BatchNormalization", ["x", "scale", "bias", "bias", "var"], ["n"]),
        helper.make_node("Add", ["n", "bias"], ["y"]),
    ]
    initializers = {"scale": np.ones(2, np.float32), "bias": zeros, "var": np.ones(2, np.float32)}
    state = _state(_model(nodes, [_x([1, 2])], ["y"], initializers))
    state.candidates = {"scale", "bias"}
    untie_running_statistics(state)
    assert list(state.graph.node[0].input) == ["x", "scale", "bias", "bias.running_statistic", "var"]
    copied = next(init for init in state.graph.initializer if init.name == "bias.running_statistic")
    assert np.array_equal(numpy_helper.to_array(copied), zeros)


def test_declare_output_shapes_gives_outputs_the_inferred_shape() -> None:
    state = _state(_model([helper.make_node("Relu", ["x"], ["y"])], [_x(["n", 3])], ["y"]))
    declare_output_shapes(state)
    dims = state.graph.output[0].type.tensor_type.shape.dim
    assert [dim.dim_param or dim.dim_value for dim in dims] == ["n", 3]
