"""One way to name parameters: ``requires_grad``, ``frozen``, ``param_groups``, ``summary()`` and the refusals.

Every option that names parameters goes through ``ortlstm.graphs.parameters.ParameterNames``: a
name is an ONNX initializer name, a torch parameter name the export metadata records, a glob or a
module prefix. The torch model is a real dynamo export with ``optimize=True`` (a 2-layer LSTM +
Linear classifier, tests/data/lstm2_classifier_dynamo.onnx, recorded with
tests/recordings/record_parameter_names.py): its optimizer renames the LSTM's weights ``val_41``...
and folds each layer's two biases into one B, so torch names and ONNX names differ. The
param_groups test replays the recorded torch AdamW run with groups (its logits after training are
the oracle). A hand-built graph without metadata checks the spellings that need none.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlstm.graphs import build_training_models, losses, optimizers
from ortlstm.graphs.parameters import ParameterNames
from ortlstm.training import MANIFEST_FILE, Trainer

DATA = Path(__file__).resolve().parent / "data"
MODEL = DATA / "lstm2_classifier_dynamo.onnx"
RECORDED = dict(np.load(DATA / "lstm2_classifier_dynamo.npz"))

# The export's initializers and the torch parameters each is (folded) from, in the model's order.
TORCH_NAMES = {
    "head.weight": ("head.weight",),
    "head.bias": ("head.bias",),
    "val_41": ("lstm.weight_ih_l0",),
    "val_42": ("lstm.weight_hh_l0",),
    "val_64": ("lstm.bias_hh_l0", "lstm.bias_ih_l0"),
    "val_104": ("lstm.weight_ih_l1",),
    "val_105": ("lstm.weight_hh_l1",),
    "val_127": ("lstm.bias_hh_l1", "lstm.bias_ih_l1"),
}
ALL = tuple(TORCH_NAMES)
VALID_NAMES = (
    "head.weight, head.bias, lstm.weight_ih_l0 (onnx: val_41), lstm.weight_hh_l0 (onnx: val_42), "
    "lstm.bias_hh_l0 (onnx: val_64), lstm.bias_ih_l0 (onnx: val_64), lstm.weight_ih_l1 (onnx: val_104), "
    "lstm.weight_hh_l1 (onnx: val_105), lstm.bias_hh_l1 (onnx: val_127), lstm.bias_ih_l1 (onnx: val_127)"
)
HOW = (
    "Name a {noun} by its ONNX initializer name, its torch name, a glob ('lstm.*', '*.bias') "
    "or a module prefix ('lstm')"
)

# name(s) -> the initializers they select, in each spelling.
SPELLINGS = {
    "onnx name": (["val_104", "head.bias"], ["val_104", "head.bias"]),
    "torch name": (["lstm.weight_ih_l0"], ["val_41"]),
    "torch names of one folded B": (["lstm.bias_ih_l1", "lstm.bias_hh_l1"], ["val_127"]),
    "glob": (["lstm.weight_*"], ["val_41", "val_42", "val_104", "val_105"]),
    "glob over ONNX and torch names": (["*.bias*"], ["head.bias", "val_64", "val_127"]),
    "module prefix": (["head"], ["head.weight", "head.bias"]),
}


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return onnx.load(str(MODEL))


def _build(model: onnx.ModelProto, **options: object):
    return build_training_models(model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.AdamW(), **options)


def test_the_recorded_export_renames_and_folds_the_torch_parameters(model: onnx.ModelProto) -> None:
    """What the tests rely on: the metadata maps val_* to torch names, and the export computes torch's logits."""
    from ortlstm.graphs.export_metadata import read_torch_origins

    origins = read_torch_origins(model)
    assert origins is not None
    assert origins.sources == TORCH_NAMES
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"x": RECORDED["x"]})
    np.testing.assert_allclose(logits, RECORDED["logits_before"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_requires_grad_and_frozen_take_every_spelling(model: onnx.ModelProto, spelling: str) -> None:
    names, expected = SPELLINGS[spelling]
    trained = _build(model, requires_grad=names).signature
    assert list(trained.params) == expected
    frozen = _build(model, frozen=names).signature
    assert list(frozen.params) == [name for name in ALL if name not in expected]
    assert sorted(frozen.frozen, key=ALL.index) == sorted(expected, key=ALL.index)


@pytest.mark.parametrize(
    "groups",
    [
        # torch names, one by one
        (
            ["lstm.bias_ih_l0", "lstm.bias_hh_l0", "lstm.bias_ih_l1", "lstm.bias_hh_l1"],
            ["head.weight", "head.bias"],
        ),
        (["lstm.bias_*"], ["head.*"]),  # globs
        (["val_64", "val_127"], ["head"]),  # ONNX names, a module prefix
    ],
    ids=["torch names", "globs", "onnx names and a module prefix"],
)
def test_param_groups_by_any_spelling_train_as_torch_did(groups: tuple[list[str], list[str]]) -> None:
    """torch's AdamW with the LSTM's biases undecayed and the head at half the lr, replayed by a Trainer."""
    lr, weight_decay, head_scale, updates = RECORDED["hyperparameters"]
    trainer = Trainer(
        MODEL,
        loss=losses.Loss.cross_entropy(),
        optimizer=optimizers.AdamW(lr=float(lr), weight_decay=float(weight_decay)),
        param_groups=[
            optimizers.ParamGroup(groups[0], weight_decay=0.0),
            optimizers.ParamGroup(groups[1], lr_scale=float(head_scale)),
        ],
        threads=1,
    )
    assert [group.params for group in trainer.spec.param_groups] == [tuple(group) for group in groups]  # as given
    for _ in range(int(updates)):
        trainer.step(RECORDED["x"], target=RECORDED["labels"])
    _, logits = trainer.evaluate(RECORDED["x"], target=RECORDED["labels"], outputs=["logits"])
    np.testing.assert_allclose(logits, RECORDED["logits_grouped"], rtol=1e-4, atol=2e-5)
    # The groups matter: torch without them ends elsewhere, far outside the tolerance.
    assert np.max(np.abs(RECORDED["logits_grouped"] - RECORDED["logits_ungrouped"])) > 1e-3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"requires_grad": ["lstm.weight_ih_l9"]},
            "requires_grad: 'lstm.weight_ih_l9' matches no parameter of the model (did you mean "
            f"'lstm.weight_ih_l1' or 'lstm.weight_ih_l0'?). Its parameters are: {VALID_NAMES}. "
            + HOW.format(noun="parameter"),
        ),
        (
            {"frozen": ["encoder", "hed"]},
            "frozen: ['encoder', 'hed'] match no parameter of the model (did you mean 'head'?). Its parameters are: "
            f"{VALID_NAMES}. "
            + HOW.format(noun="parameter"),
        ),
        (
            {"frozen": ["head"], "param_groups": [optimizers.ParamGroup(["head.bias"])]},
            "param_groups[0]: 'head.bias' matches no trained parameter of the model; 'head.bias' names only "
            "parameters that are not trained (frozen, left out of requires_grad, or not reaching the loss): a group "
            "sets how trained parameters train (torch would ignore it), so leave those out of it or train them. "
            "Its trained parameters are: "
            + VALID_NAMES.replace("head.weight, head.bias, ", "")
            + ". "
            + HOW.format(noun="trained parameter"),
        ),
        (
            {"requires_grad": ["lstm.bias_ih_l0"]},
            "requires_grad: 'val_64' is one tensor folded from torch parameters ['lstm.bias_hh_l0', "
            "'lstm.bias_ih_l0']; the names train ['lstm.bias_ih_l0'] but not ['lstm.bias_hh_l0'], and one tensor "
            "cannot be half trained. Name all of them ('val_64' or ['lstm.bias_hh_l0', 'lstm.bias_ih_l0']), or none "
            "(export with optimize=False to keep them apart)",
        ),
        (
            {"param_groups": [optimizers.ParamGroup(["lstm"]), optimizers.ParamGroup(["*.bias", "lstm.bias_*"])]},
            "some parameters appear in more than one parameter group: lstm.bias_hh_l0 + lstm.bias_ih_l0 "
            "(onnx: val_64) in groups 0 and 1, lstm.bias_hh_l1 + lstm.bias_ih_l1 (onnx: val_127) in groups 0 and 1",
        ),
    ],
    ids=["requires_grad miss", "frozen misses", "group of frozen", "half a folded B", "overlapping groups"],
)
def test_refusals_name_parameters_by_torch_name_and_list_the_valid_ones(
    model: onnx.ModelProto, options: dict, message: str
) -> None:
    with pytest.raises(ValueError) as raised:
        _build(model, **options)
    assert str(raised.value) == message


def test_a_long_list_of_valid_names_is_cut_but_keeps_those_near_the_miss() -> None:
    encoder, decoder = [f"encoder.{i}.weight" for i in range(25)], [f"decoder.{i}.weight" for i in range(5)]
    names = ParameterNames.of([*encoder, *decoder], {})
    listed = names.valid_names(["decoder.9.weight"])
    assert listed == [*encoder[:20], *decoder, "... 5 more"]
    assert names.valid_names(["nothing"])[-1] == "... 10 more"
    assert len(names.valid_names(["nothing"])) == 21
    with pytest.raises(ValueError, match=r"'decoder\.3\.weigth' matches no parameter .*you mean 'decoder\.3\.weight'"):
        names.select("requires_grad", ["decoder.3.weigth"])


def test_summary_names_the_frozen_parameters_by_torch_name() -> None:
    trainer = Trainer(MODEL, loss=losses.Loss.cross_entropy(), optimizer=optimizers.AdamW(), frozen=["lstm"], threads=1)
    summary = trainer.summary()
    assert summary.startswith("trains 2 parameters, 24 values:"), summary
    assert summary.splitlines()[-1] == (
        "frozen (constants): lstm.weight_ih_l0 (onnx: val_41), lstm.weight_hh_l0 (onnx: val_42), "
        "lstm.bias_hh_l0 + lstm.bias_ih_l0 (onnx: val_64), lstm.weight_ih_l1 (onnx: val_104), "
        "lstm.weight_hh_l1 (onnx: val_105), lstm.bias_hh_l1 + lstm.bias_ih_l1 (onnx: val_127)"
    )


# ---- a hand-built graph: no metadata, ONNX names only ---------------------------------------------


def hand_built_model() -> onnx.ModelProto:
    """x [2, 3] -> MatMul(encoder.weight) + encoder.bias -> Tanh -> MatMul(head.weight) + head.bias -> y [2, 2]."""
    rng = np.random.default_rng(11)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "encoder.weight"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "encoder.bias"),
        numpy_helper.from_array(rng.standard_normal((4, 2)).astype(np.float32), "head.weight"),
        numpy_helper.from_array(rng.standard_normal(2).astype(np.float32), "head.bias"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "encoder.weight"], ["a"]),
        helper.make_node("Add", ["a", "encoder.bias"], ["b"]),
        helper.make_node("Tanh", ["b"], ["h"]),
        helper.make_node("MatMul", ["h", "head.weight"], ["c"]),
        helper.make_node("Add", ["c", "head.bias"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["head.bias"], ["head.bias"]),
        (["*.weight"], ["encoder.weight", "head.weight"]),
        (["encoder"], ["encoder.weight", "encoder.bias"]),
    ],
    ids=["onnx name", "glob", "module prefix"],
)
def test_a_graph_without_metadata_takes_onnx_names_globs_and_prefixes(names: list[str], expected: list[str]) -> None:
    model = hand_built_model()
    every = ["encoder.weight", "encoder.bias", "head.weight", "head.bias"]
    build = build_training_models
    sgd = optimizers.SGD(lr=0.1)
    trained = build(model, loss=losses.Loss.mse_loss(), optimizer=sgd, requires_grad=names).signature
    assert list(trained.params) == expected
    frozen = build(model, loss=losses.Loss.mse_loss(), optimizer=sgd, frozen=names).signature
    assert list(frozen.params) == [name for name in every if name not in expected]
    grouped = Trainer(
        model, loss=losses.Loss.mse_loss(), optimizer=sgd, param_groups=[optimizers.ParamGroup(names, lr_scale=0.0)]
    )
    before = grouped.parameters
    grouped.step(np.ones((2, 3), np.float32), target=np.zeros((2, 2), np.float32))
    after = grouped.parameters
    unchanged = [name for name in every if np.array_equal(before[name], after[name])]
    assert unchanged == expected  # lr_scale=0 reached exactly the group's parameters
    with pytest.raises(
        ValueError,
        match=r"^requires_grad: 'decoder' matches no parameter of the model \(did you mean 'encoder'\?\)\. Its "
        r"parameters are: encoder\.weight, encoder\.bias, head\.weight, head\.bias\. Name a parameter",
    ):
        build(model, loss=losses.Loss.mse_loss(), optimizer=sgd, requires_grad=["decoder"])


# ---- the command line: fit and train-step with torch names ----------------------------------------


def _cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ortlstm", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_fit_takes_torch_names_globs_and_prefixes(tmp_path: Path) -> None:
    np.savez(tmp_path / "data.npz", x=RECORDED["x"], target=RECORDED["labels"])
    done = _cli(
        "fit", MODEL, "--data", "data.npz", "--loss", "cross_entropy", "--optimizer", "adamw", "--epochs", "1",
        "--batch-size", "6", "--threads", "1", "--out", "trained.onnx",
        "--requires-grad", "lstm.weight_ih_l0", "lstm.bias_*_l1", "head",
        "--frozen", "head.bias",
        "--param-groups", '[{"params": ["lstm.bias_hh_l1", "lstm.bias_ih_l1"], "weight_decay": 0}]',
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    before, after = (
        {init.name: numpy_helper.to_array(init) for init in onnx.load(str(path)).graph.initializer}
        for path in (MODEL, tmp_path / "trained.onnx")
    )
    changed = [name for name in ALL if not np.array_equal(before[name], after[name])]
    assert changed == ["head.weight", "val_41", "val_127"]

    missed = _cli(
        "fit", MODEL, "--data", "data.npz", "--loss", "cross_entropy", "--optimizer", "adamw", "--epochs", "1",
        "--batch-size", "6", "--param-groups", '[{"params": ["lstm.weight_ih_l9"]}]', cwd=tmp_path,
    )  # fmt: skip
    assert missed.returncode != 0
    assert "Traceback" not in missed.stderr
    assert (
        "ortlstm fit: error: param_groups[0]: 'lstm.weight_ih_l9' matches no trained parameter of the model (did you "
        f"mean 'lstm.weight_ih_l1' or 'lstm.weight_ih_l0'?). Its trained parameters are: {VALID_NAMES}."
    ) in missed.stderr, missed.stderr


def test_train_step_takes_torch_names_and_saves_the_onnx_ones(tmp_path: Path) -> None:
    import json

    done = _cli(
        "train-step", MODEL, "run", "--loss", "cross_entropy", "--optimizer", "adamw",
        "--requires-grad", "lstm", "--frozen", "lstm.*_l1",
        "--param-groups", '[{"params": ["lstm.bias_ih_l0", "lstm.bias_hh_l0"], "weight_decay": 0}]',
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    spec = json.loads((tmp_path / "run" / MANIFEST_FILE).read_text())["spec"]
    assert spec["requires_grad"] == ["val_41", "val_42", "val_64"]
    assert spec["frozen"] == ["lstm.*_l1"]
    assert spec["param_groups"][0]["params"] == ["lstm.bias_ih_l0", "lstm.bias_hh_l0"]
    reopened = Trainer.open(tmp_path / "run", threads=1)  # the names saved as given resolve again
    assert reopened.signature.params == ("val_41", "val_42", "val_64")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reopened.step(RECORDED["x"], target=RECORDED["labels"])


def test_a_refusal_on_the_backward_path_names_the_torch_parameter(model: onnx.ModelProto) -> None:
    """No gradient rule on layer 0's input weights' path: the refusal and its frozen= hint use the torch name."""
    blocked = onnx.ModelProto()
    blocked.CopyFrom(model)
    lstm = next(node for node in blocked.graph.node if node.op_type == "LSTM" and node.input[1] == "val_41")
    lstm.input[1] = "val_41_hard"
    blocked.graph.node.insert(0, helper.make_node("Hardmax", ["val_41"], ["val_41_hard"], name="no_rule"))
    with pytest.raises(ValueError) as raised:
        _build(blocked)
    message = str(raised.value)
    assert "and 1 parameter(s) ['lstm.weight_ih_l0 (onnx: val_41)']" in message, message
    assert "Freeze them (frozen=['lstm.weight_ih_l0'] on the Trainer, --frozen on the command line)" in message, message
    assert _build(blocked, frozen=["lstm.weight_ih_l0"]).signature.frozen == ("val_41",)


@pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime.training") is None, reason="needs onnxruntime-training (the train env)"
)
def test_generate_artifacts_takes_the_same_names(model: onnx.ModelProto, tmp_path: Path) -> None:
    """The onnxruntime-training path resolves requires_grad and frozen_params with the same resolver."""
    from onnxruntime.training import artifacts as ort_artifacts

    from ortlstm.graphs import generate_artifacts

    written = generate_artifacts(
        model,
        requires_grad=["lstm.weight_*_l1", "head"],
        frozen_params=["lstm.bias_*"],
        loss=ort_artifacts.LossType.CrossEntropyLoss,
        artifact_directory=tmp_path,
    )
    training = onnx.load(str(written.training_model))
    accumulated = [value.name for value in training.graph.input if value.name.endswith("_grad.accumulation.buffer")]
    trained = sorted(name.removesuffix("_grad.accumulation.buffer") for name in accumulated)
    assert trained == sorted(["val_104", "val_105", "head.weight", "head.bias"])
    with pytest.raises(ValueError, match=r"^frozen_params: 'lstm\.weight_ih_l9' matches no parameter of the model"):
        generate_artifacts(model, frozen_params=["lstm.weight_ih_l9"], artifact_directory=tmp_path / "missed")


def test_a_torch_parameter_the_export_dropped_is_named_so() -> None:
    """torch.onnx.export's optimizer removes a zero bias: naming it says so (frozen= takes it, as nothing to do)."""
    from test_default_parameters import dynamo_like_model

    dropped = dynamo_like_model()  # extra.bias: in the signature, nowhere in the graph
    options = {"loss": losses.Loss.mse_loss(), "optimizer": optimizers.Adam()}
    with pytest.raises(ValueError) as raised:
        build_training_models(dropped, requires_grad=["extra.bias", "head"], **options)
    assert str(raised.value).startswith(
        "requires_grad: 'extra.bias' matches no parameter of the model; the export dropped torch parameters "
        "['extra.bias'] (torch.onnx.export's optimizer removes a zero-valued bias and merges equal tensors): export "
        "with optimize=False to keep them. Its parameters are: lstm.weight_ih_l0 (onnx: val_3), "
    ), raised.value
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warning that extra.bias is not in the export
        frozen = build_training_models(dropped, frozen=["extra.bias", "head"], **options).signature
    assert "head.bias" in frozen.frozen
