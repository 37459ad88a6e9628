"""The batch (and sequence length) torch.onnx.export fixes by default: freed where safe, else a clear refusal.

Oracles: the same torch modules exported with a dynamic batch and length (tests/data/fixed_dims/,
recorded by tests/recordings/record_fixed_dims.py with torch 2.13): a fixed export freed by
``prepare`` must train to the same losses and parameters; for the refusals, the node the torch
code makes depend on the size (a Reshape to ``[B * T, F]``, a Linear over every step).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import onnx.reference
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlstm import fit as fitting
from ortlstm.__main__ import main
from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.prepare import prepare_model
from ortlstm.graphs.prepare.fixed_dims import ExportDim, free_export_dims
from ortlstm.graphs.prepare.state import Preparation
from ortlstm.training import Trainer

DATA = Path(__file__).parent / "data" / "fixed_dims"
BATCH, LENGTH = 8, 6  # the exports' example input: [8, 6, 2]
BATCH_ADVICE = (  # torch.cat([y[:, -1], torch.ones(x.shape[0], 1)], 1): dynamo writes the ones as [8, 1]
    "(torch.onnx.export's default: the example input's shape), and node 'node_cat' (Concat) depends on it; "
    're-export with dynamic_shapes={"x": {0: torch.export.Dim("batch")}} (dynamo, the default) or '
    'dynamic_axes={"x": {0: "batch"}} (dynamo=False)'
)
LENGTH_ADVICE = (
    "the model was exported with a fixed length of 6 at dim 1 (torch.onnx.export's default: the example input's "
    "shape), and node 'node_linear' (Gemm) depends on it; if the torch model takes other lengths, re-export "
    'with dynamic_shapes={"x": {1: torch.export.Dim("seq_len")}} (dynamo, the default) or '
    'dynamic_axes={"x": {1: "seq_len"}} (dynamo=False)'
)


def load(name: str) -> onnx.ModelProto:
    return onnx.load(str(DATA / f"{name}.onnx"))


def trainer(name: str) -> Trainer:
    return Trainer(load(name), loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.5), threads=1)


def batch(size: int, length: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((size, length, 2)).astype(np.float32), rng.integers(0, 3, size)


def declared(model: onnx.ModelProto) -> list[int | str]:
    return [dim.dim_value or dim.dim_param for dim in model.graph.input[0].type.tensor_type.shape.dim]


# ---- the recorded exports ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "shape", "dims"),
    [
        ("lstm_dynamo_fixed", ["batch", "sequence", 2], [("batch", 0, 8, None), ("length", 1, 6, None)]),
        ("lstm_torchscript_fixed", ["batch", "sequence", 2], [("batch", 0, 8, None), ("length", 1, 6, None)]),
        ("flat_dynamo_fixed", ["batch", 6, 2], [("batch", 0, 8, None)]),
        ("conv_dynamo_fixed", ["batch", 6, 2], [("batch", 0, 8, None)]),
        (
            "lstm_flat_dynamo_fixed",
            ["batch", 6, 2],
            [("batch", 0, 8, None), ("length", 1, 6, "'node_linear' (Gemm)")],
        ),
        ("time_distributed_dynamo_fixed", ["batch", 6, 2], [("batch", 0, 8, None)]),
        ("time_major_flat_dynamo_fixed", ["batch", 6, 2], [("batch", 0, 8, None)]),
        (
            "learned_state_dynamo_fixed",
            [8, "sequence", 2],
            [("batch", 0, 8, "'node_lstm__2' (LSTM)"), ("length", 1, 6, None)],
        ),
        (
            "constant_feature_dynamo_fixed",
            [8, "sequence", 2],
            [("batch", 0, 8, "'node_cat' (Concat)"), ("length", 1, 6, None)],
        ),
        ("lstm_torchscript_dynamic", ["batch", "seq_len", 2], []),
        ("lstm_time_major_dynamo_fixed", ["sequence", "batch", 2], [("batch", 1, 8, None), ("length", 0, 6, None)]),
        ("crnn_head_dynamo_fixed", ["sequence", "batch", 2], [("batch", 1, 8, None), ("length", 0, 6, None)]),
    ],
)
def test_which_dims_the_prepared_export_frees(name: str, shape: list[int | str], dims: list[tuple]) -> None:
    prepared = prepare_model(load(name))
    assert declared(prepared.model) == shape
    assert [(dim.kind, dim.axis, dim.size, dim.fixed_by) for dim in prepared.export_dims] == dims


@pytest.mark.parametrize(
    ("fixed", "dynamic", "length"),  # a negative length: time-major x [T, N, F]
    [
        ("lstm_dynamo_fixed", "lstm_torchscript_dynamic", 7),
        ("lstm_torchscript_fixed", "lstm_torchscript_dynamic", 7),
        ("flat_dynamo_fixed", "flat_dynamo_dynamic", LENGTH),
        ("conv_dynamo_fixed", "conv_dynamo_dynamic", LENGTH),
        ("time_distributed_dynamo_fixed", "time_distributed_dynamo_dynamic", LENGTH),  # x.reshape(B * T, F)
        ("time_major_flat_dynamo_fixed", "time_major_flat_dynamo_dynamic", LENGTH),  # x.view(T * B, F)
        ("crnn_head_dynamo_fixed", "crnn_head_torchscript_dynamic", -7),  # view(T * b, h): both dims freed
    ],
)
def test_a_freed_export_trains_as_the_dynamic_export_does(fixed: str, dynamic: str, length: int) -> None:
    freed, oracle = trainer(fixed), trainer(dynamic)
    for size, seed in ((5, 0), (BATCH + 3, 1), (1, 2)):  # other batches than the export's 8, one of 1
        x, y = batch(size, abs(length), seed)
        x = x.transpose(1, 0, 2).copy() if length < 0 else x
        assert float(freed.step(x, target=y)) == pytest.approx(float(oracle.step(x, target=y)), rel=1e-6, abs=0)
    # The exporters name the LSTM's folded weights differently; each weight has its own shape here.
    by_shape = {value.shape: value for value in oracle.parameters.values()}
    assert len(by_shape) == len(oracle.parameters) == len(freed.parameters)
    for value in freed.parameters.values():
        np.testing.assert_allclose(value, by_shape[value.shape], rtol=1e-6, atol=1e-7)


def test_a_stateful_trainer_carries_the_state_of_a_freed_batch() -> None:
    """with_carried_state feeds the LSTM's state from inputs [1, ?, H]: they follow the freed batch."""
    runs = []
    for name in ("lstm_dynamo_fixed", "lstm_torchscript_dynamic"):
        model = Trainer(load(name), loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.5), stateful=True)
        runs.append([float(model.step(*batch(5, 7, seed)[:1], target=batch(5, 7, seed)[1])) for seed in range(3)])
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-6, atol=0)


def test_a_trained_state_the_export_expanded_over_its_batch_is_refused_as_a_fold() -> None:
    """h0.expand(1, x.shape[0], H), folded by dynamo to [1, 8, H]: refused as a fold.

    Its batch stays fixed, and training it apart from h0 would not train torch's parameter
    (graphs/prepare/torch_folds.py refuses it).
    """
    with pytest.raises(ValueError, match=r"initializer '\w+' \[1, 8, 3\] was folded by the exporter's optimizer "
                       r"from torch parameters \['h0'\].*re-export with torch.onnx.export\(..., optimize=False\)"):
        trainer("learned_state_dynamo_fixed")


def test_a_batch_the_export_fixed_for_good_is_refused_naming_the_node_and_the_export_argument() -> None:
    model = trainer("constant_feature_dynamo_fixed")
    x, y = batch(BATCH, LENGTH)
    assert np.isfinite(float(model.step(x, target=y)))  # the export's own batch still trains
    with pytest.raises(ValueError) as raised:
        model.step(*batch(5, LENGTH)[:1], target=y[:5])
    assert str(raised.value) == (
        "step(): input 'x' has batch 5 at dim 0, but the model was exported with a fixed batch of 8 at dim 0 "
        f"{BATCH_ADVICE}; or pass batches of shape [8, sequence, 2]"
    )
    assert np.isfinite(float(model.step(batch(BATCH, 9)[0], target=y)))  # any length: the length was freed


def test_a_length_the_export_fixed_for_good_is_refused_naming_the_node() -> None:
    model = trainer("lstm_flat_dynamo_fixed")
    x, y = batch(5, LENGTH)
    assert np.isfinite(float(model.step(x, target=y)))  # any batch: the batch was freed
    with pytest.raises(ValueError) as raised:
        model.step(batch(5, 7)[0], target=y)
    assert str(raised.value) == (
        f"step(): input 'x' has length 7 at dim 1, but {LENGTH_ADVICE}; or pass batches of shape [batch, 6, 2]"
    )


# ---- fit ----------------------------------------------------------------------------------------------


def test_fit_of_a_fixed_batch_export_validates_a_ragged_last_batch_as_the_dynamic_export() -> None:
    histories = []
    for name in ("flat_dynamo_fixed", "flat_dynamo_dynamic"):
        x, y = batch(13, LENGTH)
        val_x, val_y = batch(7, LENGTH, seed=1)
        result = fitting.fit(
            trainer(name),
            {"x": x, "target": y},
            model=load(name),
            val={"x": val_x, "target": val_y},
            epochs=2,
            batch_size=4,  # batches of 4, 4, 4, 1; validation 4 then 3
            log=lambda line: None,
        )
        histories.append(result.history)
    assert histories[0] == histories[1]


def test_fit_batches_a_freed_time_major_export_along_its_batch_axis() -> None:
    """nn.LSTM's default layout: x [T, N, F], the batch at axis 1 (the freed dim's name tells fit)."""
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((7, 13, 2)).astype(np.float32), "target": rng.integers(0, 3, 13)}
    val = {"x": rng.standard_normal((7, 5, 2)).astype(np.float32), "target": rng.integers(0, 3, 5)}
    histories = []
    for name in ("lstm_time_major_dynamo_fixed", "lstm_time_major_torchscript_dynamic"):
        result = fitting.fit(
            trainer(name),
            data,
            model=load(name),
            val=val,
            epochs=2,
            batch_size=4,  # length 7, not the export's 6; batches of 4, 4, 4, 1; validation 4 then 1
            log=lambda line: None,
        )
        histories.append(result.history)
    assert histories[0] == histories[1]


def test_fit_names_the_export_for_a_length_it_fixed_not_the_batch_axis() -> None:
    x, y = batch(6, LENGTH)
    with pytest.raises(ValueError) as raised:
        fitting.fit(
            trainer("lstm_flat_dynamo_fixed"),
            {"x": x, "target": y},
            model=load("lstm_flat_dynamo_fixed"),
            val={"x": batch(6, 7)[0], "target": y},
            epochs=1,
            batch_size=4,
            log=lambda line: None,
        )
    assert str(raised.value) == (
        "val: array 'x' (model input) must be float32 [batch, 6, 2] (batch axis 0), got float32 [6, 7, 2]; "
        f"its dim 1 is 7: {LENGTH_ADVICE}"
    )


@pytest.mark.parametrize(
    ("batch_size", "val_samples", "why"),
    [
        (5, 8, ""),
        (BATCH, 12, " (val: 12 samples, last batch 4)"),
    ],
)
def test_fit_refuses_batches_the_export_fixed_for_good_before_training(
    batch_size: int, val_samples: int, why: str
) -> None:
    x, y = batch(16, LENGTH)
    val_x, val_y = batch(val_samples, LENGTH, seed=1)
    model = trainer("constant_feature_dynamo_fixed")
    with pytest.raises(ValueError) as raised:
        fitting.fit(
            model,
            {"x": x, "target": y},
            model=load("constant_feature_dynamo_fixed"),
            val={"x": val_x, "target": val_y},
            epochs=1,
            batch_size=batch_size,
            log=lambda line: None,
        )
    assert str(raised.value) == (
        f"--batch-size {batch_size}: the model was exported with a fixed batch of 8 at dim 0 {BATCH_ADVICE}; "
        f"or pass --batch-size 8 with a multiple of 8 samples{why}"
    )
    assert model.global_step == 0  # refused before any update


def test_the_fit_command_refuses_a_fixed_batch_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x, y = batch(12, LENGTH)
    np.savez(tmp_path / "train.npz", x=x, target=y)
    onnx.save(load("constant_feature_dynamo_fixed"), str(tmp_path / "model.onnx"))
    argv = [str(tmp_path / "model.onnx"), "--data", str(tmp_path / "train.npz"), "--loss", "cross_entropy"]
    assert main(["fit", *argv, "--optimizer", "sgd", "--lr", "0.1", "--epochs", "1", "--batch-size", "5"]) == 1
    error = capsys.readouterr().err
    assert "Traceback" not in error
    assert "--batch-size 5: the model was exported with a fixed batch of 8 at dim 0" in error
    assert BATCH_ADVICE in error


# ---- the rules on small graphs ------------------------------------------------------------------------


def _model(nodes: list[onnx.NodeProto], initializers: dict[str, np.ndarray], shape: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(value, name) for name, value in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="pytorch")


def _freed(model: onnx.ModelProto, **options: object) -> tuple[Preparation, tuple[ExportDim, ...]]:
    state = Preparation(model, copy.deepcopy(model), **options)  # type: ignore[arg-type]
    free_export_dims(state)
    return state, state.export_dims


def test_a_batch_merged_and_split_again_follows_the_batch() -> None:
    """x.reshape(B * T, F) ... .reshape(B, T, H): -1 where merged, Gather(Shape(x), [0]) where split."""
    nodes = [
        helper.make_node("Reshape", ["x", "merge"], ["steps"], allowzero=1),
        helper.make_node("Relu", ["steps"], ["active"]),
        helper.make_node("Reshape", ["active", "split"], ["y"], allowzero=1),
    ]
    model = _model(nodes, {"merge": np.array([48, 2]), "split": np.array([8, 6, 2])}, [8, 6, 2])
    state, (dim,) = _freed(model)
    assert dim.freed and declared(state.model) == ["batch", 6, 2]
    assert [node.op_type for node in state.graph.node] == ["Reshape", "Relu", "Shape", "Gather", "Concat", "Reshape"]
    assert not state.graph.value_info  # the merged dim's name was the rewrite's own
    x = np.random.default_rng(0).standard_normal((5, 6, 2)).astype(np.float32)
    (y,) = onnx.reference.ReferenceEvaluator(state.model).run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_a_reshape_with_allowzero_follows_the_batch() -> None:
    reshape = helper.make_node("Reshape", ["x", "shape"], ["y"], name="view", allowzero=1)
    state, (dim,) = _freed(_model([reshape], {"shape": np.array([8, 2, 2])}, [8, 4]))
    assert dim.freed and declared(state.model) == ["batch", 4]
    (node,) = state.graph.node
    new_shape = next(init for init in state.graph.initializer if init.name == node.input[1])
    assert numpy_helper.to_array(new_shape).tolist() == [0, 2, 2]
    assert not node.attribute  # 0 copies the batch now; the constant had no 0 that allowzero kept


def test_a_constant_the_same_for_every_sample_broadcasts_one_slice() -> None:
    """A zero state folded through h0 @ R + b is [8, H] of equal rows, added to the batch's values."""
    folded = np.broadcast_to(np.arange(4, dtype=np.float32), (8, 4)).copy()
    constant = helper.make_node("Constant", [], ["folded"], value=numpy_helper.from_array(folded))
    add = helper.make_node("Add", ["x", "folded"], ["y"])
    state, (dim,) = _freed(_model([constant, add], {}, [8, 4]))
    assert dim.freed and declared(state.model) == ["batch", 4]
    sliced = next(init for init in state.graph.initializer if init.name == state.graph.node[1].input[1])
    np.testing.assert_array_equal(numpy_helper.to_array(sliced), folded[:1])


def test_a_parameter_of_the_batchs_size_keeps_it_fixed() -> None:
    """torch.nn.Parameter(torch.zeros(8, 4)) + x takes batches of 8 only; a trained slice would be another model.

    Without the export's metadata every float initializer may be a parameter.
    """
    add = helper.make_node("Add", ["x", "bias"], ["y"], name="plus")
    state, (dim,) = _freed(_model([add], {"bias": np.zeros((8, 4), np.float32)}, [8, 4]))
    assert dim.fixed_by == "'plus' (Add)" and declared(state.model) == [8, 4]


def test_a_zero_state_the_caller_trains_keeps_the_batch_fixed() -> None:
    """requires_grad of dynamo's zero state [1, 8, H] trains one state per row of a batch of 8."""
    prepared = prepare_model(load("lstm_dynamo_fixed"), keep=["val_16"])
    assert [(dim.kind, dim.fixed_by) for dim in prepared.export_dims] == [
        ("batch", "'node_lstm__2' (LSTM)"),
        ("length", None),
    ]
    assert declared(prepared.model) == [8, "sequence", 2]


@pytest.mark.parametrize(
    ("nodes", "initializers", "blamed"),
    [
        (  # rows that differ: a value per sample of the exported batch
            [helper.make_node("Add", ["x", "c"], ["y"], name="plus")],
            {"c": np.arange(32, dtype=np.float32).reshape(8, 4)},
            "plus",
        ),
        ([helper.make_node("Split", ["x", "sizes"], ["y", "z"], name="halves")], {"sizes": np.array([4, 4])}, "halves"),
        (  # [8, 4] read as [4, 8]: no entry holds the batch
            [helper.make_node("Reshape", ["x", "shape"], ["y"], name="flat")],
            {"shape": np.array([4, 8])},
            "flat",
        ),
    ],
)
def test_a_node_that_depends_on_the_fixed_batch_keeps_it_fixed(
    nodes: list[onnx.NodeProto], initializers: dict[str, np.ndarray], blamed: str
) -> None:
    model = _model(nodes, initializers, [8, 4])
    state, (dim,) = _freed(model)
    assert dim.fixed_by == f"{blamed!r} ({nodes[0].op_type})" and not dim.freed
    assert state.model == model  # unchanged


def test_a_branch_that_depends_on_the_batch_keeps_it_fixed() -> None:
    """The If reads x from the graph around it; its branch reshapes x to the exported batch."""
    branches = {
        f"{name}_branch": helper.make_graph(
            [
                helper.make_node("Constant", [], [f"{name}_shape"], value=numpy_helper.from_array(np.array([8, -1]))),
                helper.make_node("Reshape", ["x", f"{name}_shape"], [f"{name}_y"]),
            ],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)],
        )
        for name in ("then", "else")
    }
    choose = helper.make_node("If", ["flag"], ["y"], name="choose", **branches)
    state, (dim,) = _freed(_model([choose], {"flag": np.array(True)}, [8, 4]))
    assert dim.fixed_by == "'choose' (If)" and declared(state.model) == [8, 4]


def _lstm_from_state(state_nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    """x [8, 6, 2] -> Transpose -> LSTM (H=3) whose initial_h is ``state``, as dynamo writes nn.LSTM."""
    rng = np.random.default_rng(0)
    weights = {"W": rng.uniform(-0.5, 0.5, (1, 12, 2)), "R": rng.uniform(-0.5, 0.5, (1, 12, 3))}
    weights = {name: value.astype(np.float32) for name, value in weights.items()}
    nodes = [
        *state_nodes,
        helper.make_node("Transpose", ["x"], ["x_tnf"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["x_tnf", "W", "R", "", "", "state"], ["y"], name="lstm", hidden_size=3),
    ]
    return _model(nodes, weights, [8, 6, 2])


def test_a_zero_state_expanded_from_a_constant_shape_is_omitted() -> None:
    """dynamo with optimize=False: zeros = Expand(0.0, [1, 8, 3]), the shape all constants."""
    zero = helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0.0, np.float32)))
    shape = helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(np.array([1, 8, 3])))
    state, dims = _freed(_lstm_from_state([zero, shape, helper.make_node("Expand", ["zero", "shape"], ["state"])]))
    assert [(dim.kind, dim.fixed_by) for dim in dims] == [("batch", None), ("length", None)]
    assert declared(state.model) == ["batch", "sequence", 2]
    assert list(next(node for node in state.graph.node if node.op_type == "LSTM").input)[5] == ""


def test_a_state_that_is_not_zeros_keeps_the_batch_fixed() -> None:
    """A constant initial state of ones, one row per sample of the exported batch: no zeros to omit."""
    ones = helper.make_node("Constant", [], ["state"], value=numpy_helper.from_array(np.ones((1, 8, 3), np.float32)))
    state, dims = _freed(_lstm_from_state([ones]))
    assert [(dim.kind, dim.fixed_by) for dim in dims] == [("batch", "'lstm' (LSTM)"), ("length", None)]
    assert declared(state.model) == [8, "sequence", 2]


def test_a_batch_the_caller_fixes_is_not_freed() -> None:
    reshape = helper.make_node("Reshape", ["x", "shape"], ["y"])
    state, dims = _freed(_model([reshape], {"shape": np.array([8, -1])}, [8, 4]), fixed_shapes={"x": [8, None]})
    assert dims == () and declared(state.model) == [8, 4]


def test_a_positive_dim_of_another_producer_is_its_declaration() -> None:
    reshape = helper.make_node("Reshape", ["x", "shape"], ["y"])
    model = _model([reshape], {"shape": np.array([8, -1])}, [8, 4])
    model.producer_name = "paddle2onnx"  # it writes -1 for a dynamic batch: 8 is meant
    state, dims = _freed(model)
    assert dims == () and declared(state.model) == [8, 4]
