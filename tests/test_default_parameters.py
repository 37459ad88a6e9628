"""What the Trainer trains when the user names nothing, what ``frozen=`` leaves out, and the options it takes.

Torch's rule: a model trains its parameters, never buffers (BatchNorm's running statistics) nor
the tensors its forward builds (a ``torch.zeros`` initial state). A dynamo export says which
initializer is which in its metadata (``ortlstm.graphs.export_metadata``); the models here carry
that metadata written the way torch 2.13 writes it (graph signature, ``folded_from``), so the
checks run without torch; a torch export at the end runs where torch is installed. The recorded
torch runs replayed with the Trainer's defaults are in tests/test_train_step_parity.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlstm.graphs import build_training_models, losses, optimizers
from ortlstm.graphs.export_metadata import FOLDED_FROM_KEY, KIND_KEY, SIGNATURE_KEY, read_torch_origins
from ortlstm.graphs.parameters import matches, resolve_frozen
from ortlstm.ops import session_options
from ortlstm.training import Trainer

_RNG = np.random.default_rng(3)
FEATURES, HIDDEN, CLASSES = 3, 4, 2


def _value_info_with(name: str, **metadata: str) -> onnx.ValueInfoProto:
    info = helper.make_empty_tensor_value_info(name)
    for key, value in metadata.items():
        entry = info.metadata_props.add()
        entry.key, entry.value = key, value
    return info


def _signature(*lines: str) -> str:
    return "\n# inputs\n" + "\n".join(lines) + "\nx: USER_INPUT\n\n# outputs\nlogits: USER_OUTPUT\n"


def dynamo_like_model(*, with_metadata: bool = True) -> onnx.ModelProto:
    """A tagger as torch 2.13's dynamo exporter writes it with optimize=True.

    x [batch, T, F] -> LSTM (W, R, B folded from torch's lstm.* parameters, initial state a 0-D
    zero expanded to [1, batch, H]) -> BatchNormalization over the hidden units (its running
    mean merged into the equal bias ``bn.bias``, as onnxscript's optimizer merges equal
    initializers) -> Gemm (head.weight^T folded as val_9) -> logits [batch, T, CLASSES].
    ``lstm.bias_hh_l0``... are listed in the signature; ``extra.bias`` (a zero bias the
    optimizer dropped) is in the signature and nowhere in the graph.
    """
    W = _RNG.standard_normal((1, 4 * HIDDEN, FEATURES)).astype(np.float32) * 0.4
    R = _RNG.standard_normal((1, 4 * HIDDEN, HIDDEN)).astype(np.float32) * 0.4
    B = _RNG.standard_normal((1, 8 * HIDDEN)).astype(np.float32) * 0.1
    initializers = [
        numpy_helper.from_array(W, "val_3"),
        numpy_helper.from_array(R, "val_4"),
        numpy_helper.from_array(B, "val_5"),
        numpy_helper.from_array(np.zeros((), np.float32), "val_1"),
        numpy_helper.from_array(np.asarray([1], np.int64), "one"),
        numpy_helper.from_array(np.asarray([HIDDEN], np.int64), "hidden"),
        numpy_helper.from_array(np.ones(HIDDEN, np.float32), "bn.weight"),
        numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "bn.bias"),
        numpy_helper.from_array(np.ones(HIDDEN, np.float32) * 2.0, "bn.running_var"),
        numpy_helper.from_array(_RNG.standard_normal((HIDDEN, CLASSES)).astype(np.float32), "val_9"),
        numpy_helper.from_array(np.zeros(CLASSES, np.float32), "head.bias"),
        numpy_helper.from_array(np.asarray([0, 2, 1], np.int64), "to_channels"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"], start=0, end=1),
        helper.make_node("Concat", ["one", "x_shape", "hidden"], ["state_shape"], axis=0),
        helper.make_node("Expand", ["val_1", "state_shape"], ["zeros"]),
        helper.make_node("Transpose", ["x"], ["x_t"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["x_t", "val_3", "val_4", "val_5", "", "zeros", "zeros"], ["y"], hidden_size=HIDDEN),
        helper.make_node("Squeeze", ["y", "one"], ["y3"]),
        helper.make_node("Transpose", ["y3"], ["y_b"], perm=[1, 2, 0]),
        # The running mean is the merged "bn.bias" (zeros), also BatchNorm's bias: the two were
        # equal, so the exporter kept one initializer for both.
        helper.make_node(
            "BatchNormalization", ["y_b", "bn.weight", "bn.bias", "bn.bias", "bn.running_var"], ["normed"]
        ),
        helper.make_node("Transpose", ["normed"], ["features"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["features", "val_9"], ["scores"]),
        helper.make_node("Add", ["scores", "head.bias"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tagger",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "steps", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "steps", CLASSES])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    if with_metadata:
        entry = model.graph.metadata_props.add()
        entry.key = SIGNATURE_KEY
        entry.value = _signature(
            "p_lstm_weight_ih_l0: PARAMETER target='lstm.weight_ih_l0'",
            "p_lstm_weight_hh_l0: PARAMETER target='lstm.weight_hh_l0'",
            "p_lstm_bias_ih_l0: PARAMETER target='lstm.bias_ih_l0'",
            "p_lstm_bias_hh_l0: PARAMETER target='lstm.bias_hh_l0'",
            "p_bn_weight: PARAMETER target='bn.weight'",
            "p_bn_bias: PARAMETER target='bn.bias'",
            "p_head_weight: PARAMETER target='head.weight'",
            "p_head_bias: PARAMETER target='head.bias'",
            "p_extra_bias: PARAMETER target='extra.bias'",
            "b_bn_running_mean: BUFFER target='bn.running_mean' persistent=True",
            "b_bn_running_var: BUFFER target='bn.running_var' persistent=True",
        )
        model.graph.value_info.extend(
            [
                _value_info_with("val_3", **{FOLDED_FROM_KEY: "['lstm.weight_ih_l0', 'val_0', 'val_2']"}),
                _value_info_with("val_4", **{FOLDED_FROM_KEY: "['lstm.weight_hh_l0', 'val_0']"}),
                _value_info_with("val_5", **{FOLDED_FROM_KEY: "['lstm.bias_hh_l0', 'lstm.bias_ih_l0', 'val_7']"}),
                _value_info_with("val_9", **{FOLDED_FROM_KEY: "['head.weight']"}),
                _value_info_with("bn.weight", **{KIND_KEY: "PARAMETER"}),
                _value_info_with("bn.bias", **{KIND_KEY: "PARAMETER"}),
                _value_info_with("bn.running_var", **{KIND_KEY: "BUFFER"}),
                _value_info_with("head.bias", **{KIND_KEY: "PARAMETER"}),
            ]
        )
    onnx.checker.check_model(model)
    return model


TORCH_PARAMETERS = {"val_3", "val_4", "val_5", "bn.weight", "bn.bias", "val_9", "head.bias"}


def _batch(batch: int = 3, steps: int = 5) -> tuple[np.ndarray, np.ndarray]:
    x = _RNG.standard_normal((batch, steps, FEATURES)).astype(np.float32)
    return x, _RNG.standard_normal((batch, steps, CLASSES)).astype(np.float32)


def _build(model: onnx.ModelProto, **options: object):
    return build_training_models(model, loss=losses.Loss.mse_loss(), optimizer=optimizers.Adam(), **options)


def test_origins_come_from_the_signature_and_folded_from() -> None:
    origins = read_torch_origins(dynamo_like_model())
    assert origins is not None
    assert origins.kinds["bn.running_mean"] == "BUFFER"
    assert origins.sources["val_3"] == ("lstm.weight_ih_l0",)
    assert origins.sources["val_5"] == ("lstm.bias_hh_l0", "lstm.bias_ih_l0")
    assert origins.sources["val_9"] == ("head.weight",)
    assert "val_1" not in origins.sources
    assert "bn.running_var" not in origins.sources
    assert origins.dropped == ("extra.bias",)
    assert read_torch_origins(dynamo_like_model(with_metadata=False)) is None


def test_defaults_train_the_torch_parameters_only() -> None:
    """Never the 0-D zero state, never the running variance; a warning names the dropped bias."""
    with pytest.warns(UserWarning, match=r"torch parameters \['extra.bias'\] are not in the export.*optimize=False"):
        built = _build(dynamo_like_model())
    assert set(built.signature.params) == TORCH_PARAMETERS


def test_in_a_model_of_constant_weights_zero_states_are_literals() -> None:
    """paddle2onnx / spox: every weight a Constant; a zeros state Constant is not trained, a one-element bias is.

    (PP-OCRv2 Tiles two [1, 4, 64] zero Constants into its LSTMs' initial states; silero-vad's
    output bias is a [1] Constant.)
    """
    rng = np.random.default_rng(8)

    def constant(name: str, value: np.ndarray) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value.astype(np.float32), name))

    nodes = [
        constant("W", rng.uniform(-0.5, 0.5, (1, 4 * HIDDEN, FEATURES))),
        constant("R", rng.uniform(-0.5, 0.5, (1, 4 * HIDDEN, HIDDEN))),
        constant("zero_state", np.zeros((1, 1, HIDDEN))),
        constant("head.weight", rng.uniform(-0.5, 0.5, (HIDDEN, 1))),
        constant("head.bias", np.asarray([0.25])),
        helper.make_node("Constant", [], ["repeats"], value=numpy_helper.from_array(np.asarray([1, 3, 1], np.int64))),
        helper.make_node("Tile", ["zero_state", "repeats"], ["state"]),
        helper.make_node("LSTM", ["x", "W", "R", "", "", "state", "state"], ["", "h_n"], hidden_size=HIDDEN),
        helper.make_node("Squeeze", ["h_n", "zero_axis"], ["h"]),
        helper.make_node("MatMul", ["h", "head.weight"], ["scores"]),
        helper.make_node("Add", ["scores", "head.bias"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "constant_weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3, FEATURES])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 1])],
        [numpy_helper.from_array(np.asarray([0], np.int64), "zero_axis")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    built = _build(model)
    assert set(built.signature.params) == {"W", "R", "head.weight", "head.bias"}


def test_without_metadata_a_0d_initializer_is_a_literal_but_can_be_named() -> None:
    model = dynamo_like_model(with_metadata=False)
    built = _build(model)
    assert "val_1" not in built.signature.params
    assert "val_1" not in built.prepared.candidates
    named = _build(model, requires_grad=["val_1", "val_9"])
    assert named.signature.params == ("val_1", "val_9")


def test_a_merged_running_mean_stays_put_while_the_bias_trains() -> None:
    """BatchNormalization reads its own copy of the merged initializer as the running mean.

    Trained, ``bn.bias`` moves; the running mean the exported model's BatchNormalization
    reads must stay zero, as torch's buffer does in eval mode. The train step's forward with
    the trained bias equals a model whose running mean is a separate zero initializer.
    """
    model = dynamo_like_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = _build(model, requires_grad=["bn.bias"])
    batch_norm = next(node for node in built.prepared.model.graph.node if node.op_type == "BatchNormalization")
    assert batch_norm.input[2] == "bn.bias"
    assert batch_norm.input[3] != "bn.bias"
    separate = onnx.ModelProto()
    separate.CopyFrom(model)
    separate.graph.initializer.append(numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "bn.running_mean"))
    next(node for node in separate.graph.node if node.op_type == "BatchNormalization").input[3] = "bn.running_mean"
    bias = np.linspace(-1, 1, HIDDEN).astype(np.float32)
    x, _ = _batch()
    eval_session = ort.InferenceSession(
        built.eval.SerializeToString(), session_options(), providers=["CPUExecutionProvider"]
    )
    target = np.zeros((3, 5, CLASSES), np.float32)
    eval_inputs = {value.name for value in built.eval.graph.input}
    feeds = {"x": x, "bn.bias": bias, built.signature.target: target}
    logits = eval_session.run(["logits"], {name: value for name, value in feeds.items() if name in eval_inputs})[0]
    for init in separate.graph.initializer:
        if init.name == "bn.bias":
            init.CopyFrom(numpy_helper.from_array(bias, "bn.bias"))
    expected = ort.InferenceSession(separate.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        ["logits"], {"x": x}
    )[0]
    np.testing.assert_allclose(logits, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("head.bias", "head.bias", True),
        ("head", "head.bias", True),  # a module prefix
        ("hea", "head.bias", False),  # not a prefix of a dotted component
        ("lstm.weight_hh_l0*", "lstm.weight_hh_l0_reverse", True),
        ("*.bias", "head.bias", True),
        ("head.weight", "head.weight_g", False),
    ],
)
def test_pattern_matching(pattern: str, name: str, expected: bool) -> None:
    assert matches(pattern, name) is expected


def test_frozen_by_torch_names_module_prefixes_and_onnx_names() -> None:
    model = dynamo_like_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_torch_name = _build(model, frozen=["lstm", "head.weight"])
        by_onnx_name = _build(model, frozen=["val_3", "val_4", "val_5", "val_9"])
    expected = TORCH_PARAMETERS - {"val_3", "val_4", "val_5", "val_9"}
    assert set(by_torch_name.signature.params) == expected
    assert set(by_onnx_name.signature.params) == expected
    assert {"val_3", "val_9"} <= set(by_torch_name.signature.frozen)


def test_frozen_refuses_half_an_initializer_and_unknown_names() -> None:
    sources = {"val_5": ("lstm.bias_hh_l0", "lstm.bias_ih_l0")}
    with pytest.raises(ValueError, match=r"'val_5' is one tensor folded from.*freeze \['lstm.bias_hh_l0'\] but not"):
        resolve_frozen(["lstm.bias_hh*"], ["val_5"], sources)
    with pytest.raises(
        ValueError,
        match=r"frozen: 'encoder\.\*' matches no parameter of the model\. Its parameters are: "
        r"lstm\.bias_hh_l0 \(onnx: val_5\), lstm\.bias_ih_l0 \(onnx: val_5\)\. Name a parameter by",
    ):
        resolve_frozen(["encoder.*"], ["val_5"], sources)
    assert resolve_frozen(["bn.running_mean"], ["val_5"], sources, known=["bn.running_mean"]) == set()


def test_trainer_summary_names_what_it_trains() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(dynamo_like_model(), loss=losses.Loss.mse_loss(), optimizer=optimizers.Adam(), frozen=["bn"])
    trained = {parameter.name: parameter for parameter in trainer.trained}
    assert set(trained) == TORCH_PARAMETERS - {"bn.weight", "bn.bias"}
    assert trained["val_5"].sources == ("lstm.bias_hh_l0", "lstm.bias_ih_l0")
    assert trained["val_3"].shape == (1, 4 * HIDDEN, FEATURES)
    assert trained["val_3"].size == 4 * HIDDEN * FEATURES
    summary = trainer.summary()
    assert summary.startswith(f"trains 5 parameters, {sum(p.size for p in trained.values()):,} values:")
    assert "val_5" in summary
    assert "<- lstm.bias_hh_l0, lstm.bias_ih_l0" in summary
    assert "frozen (constants): " in summary
    assert "bn.weight" in summary


def _gru_with_constant_weights(rng: np.random.Generator) -> onnx.ModelProto:
    """A GRU whose W, R and B are Constant nodes (as torch 1.13 exported DeepFilterNet3's), then a Linear."""
    hidden, features = 3, 2
    constants = {
        "gru_w": rng.standard_normal((1, 3 * hidden, features)),
        "gru_r": rng.standard_normal((1, 3 * hidden, hidden)),
        "gru_b": rng.standard_normal((1, 6 * hidden)),
    }
    nodes = [
        helper.make_node(
            "Constant", [], [name], name=f"make_{name}", value=numpy_helper.from_array(value.astype(np.float32))
        )
        for name, value in constants.items()
    ]
    nodes += [
        helper.make_node("GRU", ["x", *constants], ["all_h"], name="gru", hidden_size=hidden, linear_before_reset=1),
        helper.make_node("Squeeze", ["all_h", "one"], ["h"]),
        helper.make_node("MatMul", ["h", "head"], ["y"], name="head_matmul"),
    ]
    graph = helper.make_graph(
        nodes,
        "gru_constants",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2, 1])],
        [
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.ones((hidden, 1), np.float32), "head"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_summary_says_which_parameters_were_constant_nodes(rng: np.random.Generator) -> None:
    """A Constant node's weight trains; summary() names the node's reader, and export writes it back there."""
    model = _gru_with_constant_weights(rng)
    trainer = Trainer(model, loss=losses.Loss.mse_loss(), optimizer=optimizers.SGD(lr=0.1))
    assert set(trainer.signature.params) == {"gru_w", "gru_r", "gru_b", "head"}
    lines = trainer.summary().splitlines()
    heading = lines.index(
        "Constant nodes in the model, trained as parameters (export() writes each back into its node):"
    )
    assert lines[heading + 1 :] == [
        "  gru_w <- W of GRU 'gru'",
        "  gru_r <- R of GRU 'gru'",
        "  gru_b <- B of GRU 'gru'",
    ]
    trainer.step(rng.standard_normal((4, 2, 2)).astype(np.float32), target=np.ones((4, 2, 1), np.float32))
    exported = {node.output[0]: node for node in trainer.export().graph.node if node.op_type == "Constant"}
    assert set(exported) == {"gru_w", "gru_r", "gru_b"}
    for name, node in exported.items():
        np.testing.assert_array_equal(numpy_helper.to_array(node.attribute[0].t), trainer.parameters[name])
    assert not np.array_equal(trainer.parameters["gru_w"], numpy_helper.to_array(model.graph.node[0].attribute[0].t))


# ---- fixed_shapes and the other build options on the Trainer -------------------------------------


def if_on_width_model() -> onnx.ModelProto:
    """Logits = x @ W_a if x's width is 4 else x @ W_b: an If decided by a shape, the weights inside it."""
    w_a = _RNG.standard_normal((4, CLASSES)).astype(np.float32)
    w_b = _RNG.standard_normal((4, CLASSES)).astype(np.float32)
    branch = {}
    for name, weight in (("then", w_a), ("else", w_b)):
        branch[name] = helper.make_graph(
            [
                helper.make_node("Constant", [], [f"{name}.weight"], value=numpy_helper.from_array(weight)),
                helper.make_node("MatMul", ["x", f"{name}.weight"], [f"{name}.out"]),
            ],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}.out", TensorProto.FLOAT, None)],
        )
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], start=1, end=2),
        helper.make_node("Equal", ["shape", "four"], ["is_four_vector"]),
        helper.make_node("Squeeze", ["is_four_vector"], ["is_four"]),
        helper.make_node("If", ["is_four"], ["logits"], then_branch=branch["then"], else_branch=branch["else"]),
    ]
    graph = helper.make_graph(
        nodes,
        "if_on_width",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "width"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(np.asarray([4], np.int64), "four")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def test_trainer_takes_fixed_shapes_and_saves_them_in_its_spec(tmp_path: Path) -> None:
    model = if_on_width_model()
    trainer = Trainer(
        model, loss=losses.Loss.mse_loss(), optimizer=optimizers.SGD(lr=0.1), fixed_shapes={"x": [None, 4]}
    )
    assert trainer.signature.params == ("then.weight",)
    assert trainer.spec.fixed_shapes == {"x": (None, 4)}
    x = _RNG.standard_normal((3, 4)).astype(np.float32)
    target = np.zeros((3, CLASSES), np.float32)
    first = trainer.step(x, target=target)
    assert trainer.step(x, target=target) < first
    trainer.save(tmp_path / "run.safetensors")
    resumed = Trainer.from_checkpoint(model, tmp_path / "run.safetensors")
    assert resumed.spec.to_json() == trainer.spec.to_json()
    np.testing.assert_array_equal(resumed.parameters["then.weight"], trainer.parameters["then.weight"])
    reopened = Trainer.open(trainer.write(tmp_path / "dir"))
    assert reopened.spec.fixed_shapes == {"x": (None, 4)}


def test_a_checkpoint_of_another_fixed_shape_is_refused(tmp_path: Path) -> None:
    model = dynamo_like_model(with_metadata=False)
    trainer = Trainer(
        model, loss=losses.Loss.mse_loss(), optimizer=optimizers.Adam(), fixed_shapes={"x": [None, 5, None]}
    )
    trainer.save(tmp_path / "run.safetensors")
    other = Trainer(
        model, loss=losses.Loss.mse_loss(), optimizer=optimizers.Adam(), fixed_shapes={"x": [None, 6, None]}
    )
    with pytest.raises(
        ValueError,
        match=r"saved with fixed_shapes.x=\[None, 5, None\], this trainer has fixed_shapes.x=\[None, 6, None\] ",
    ):
        other.load(tmp_path / "run.safetensors")


# ---- a real torch export (where torch is installed) ----------------------------------------------


def test_a_dynamo_export_with_zero_states_batchnorm_and_a_zero_bias(tmp_path: Path) -> None:
    """torch.onnx.export's defaults: the Trainer trains exactly the parameters torch has in the graph."""
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(FEATURES, HIDDEN, batch_first=True)
            self.norm = torch.nn.BatchNorm1d(HIDDEN)
            self.head = torch.nn.Linear(HIDDEN, CLASSES)
            self.extra = torch.nn.Linear(CLASSES, CLASSES)
            torch.nn.init.zeros_(self.extra.bias)

        def forward(self, x):
            zeros = torch.zeros(1, x.shape[0], HIDDEN)
            y, _ = self.lstm(x, (zeros, zeros))
            return self.extra(self.head(self.norm(y[:, -1])))

    net = Net().eval()
    path = tmp_path / "net.onnx"
    torch.onnx.export(
        net, (torch.randn(2, 5, FEATURES),), str(path), dynamic_shapes={"x": {0: torch.export.Dim("batch")}}
    )
    with pytest.warns(UserWarning, match=r"\['extra.bias'\] are not in the export"):
        trainer = Trainer(str(path), loss=losses.Loss.mse_loss(), optimizer=optimizers.Adam())
    covered = {source for parameter in trainer.trained for source in parameter.sources}
    expected = {name for name, _ in net.named_parameters()} - {"extra.bias"}
    assert covered == expected, trainer.summary()
    assert all(parameter.sources for parameter in trainer.trained), trainer.summary()
