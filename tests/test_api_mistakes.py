"""A new user's mistakes in the Python API and on the command line: each a clear error, never a silent wrong run.

The model is the real torch export of tests/test_parameter_names.py (a 2-layer LSTM + Linear
classifier, dynamo, optimize=True: torch names differ from the ONNX names ``val_41``...). Each
mistake below used to end in a raw Python error (``'int' object is not iterable``, ``'str' object
has no attribute 'kind'``), to be split into characters (``frozen="lstm"``), or to train wrong
(``clip_grad_norm=-1`` multiplies every gradient by a negative coefficient, as torch's does).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from ortlstm.__main__ import main
from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.optimizers.clip import ClipGradNorm
from ortlstm.training import NonFiniteStepError, Trainer

MODEL_PATH = Path(__file__).resolve().parent / "data" / "lstm2_classifier_dynamo.onnx"
MODEL = onnx.load(MODEL_PATH)  # input x [6, 4, 3] (batch 6 fixed by the export, freed), output logits [6, 5]


def _trainer(**options: Any) -> Trainer:
    options.setdefault("loss", losses.Loss.cross_entropy())
    options.setdefault("optimizer", optimizers.SGD(lr=0.1))
    return Trainer(MODEL, **options)


@pytest.mark.parametrize("keyword", ["frozen", "requires_grad", "extra_outputs"])
def test_a_string_where_a_list_of_names_goes_is_refused_not_split_into_characters(keyword: str) -> None:
    with pytest.raises(TypeError, match=rf"^{keyword} must be a list of names, got the string 'lstm'; "
                       rf"pass {keyword}=\['lstm'\]$"):
        _trainer(**{keyword: "lstm"})


def test_param_groups_take_torch_dicts_as_param_group_does() -> None:
    as_dicts = _trainer(param_groups=[{"params": ["lstm"], "weight_decay": 0.0, "lr_scale": 0.5}])
    as_groups = _trainer(param_groups=[optimizers.ParamGroup(("lstm",), weight_decay=0.0, lr_scale=0.5)])
    assert as_dicts.spec.param_groups == as_groups.spec.param_groups
    assert as_dicts.spec.param_groups[0].lr_scale == 0.5


@pytest.mark.parametrize(
    ("groups", "error", "message"),
    [
        ({"params": ["lstm"]}, TypeError, r"^param_groups: expected a list of groups, e\.g\. \[\{\"params\""),
        ([{"params": ["lstm"], "lr": 0.1}], ValueError, r"unknown: lr \(lr: give lr_scale = the group's lr / the"),
        ([{"params": "lstm"}], ValueError, r"ParamGroup\.params must be a sequence of names, got the string 'lstm'"),
        ([{"params": ["lstm"], "betas": 3}], ValueError, r"betas must be two numbers, e\.g\. \(0\.9, 0\.999\), got 3"),
    ],
)
def test_param_groups_of_the_wrong_form_name_the_group_and_the_fix(groups: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        _trainer(param_groups=groups)


def test_a_param_group_naming_only_frozen_parameters_says_they_are_not_trained() -> None:
    # torch.optim takes such a group and ignores it; here it is refused with the reason.
    with pytest.raises(ValueError, match=r"^param_groups\[0\]: 'head\.weight' matches no trained parameter of the "
                       r"model; 'head\.weight' names only parameters that are not trained \(frozen, left out of "
                       r"requires_grad, or not reaching the loss\)"):
        _trainer(frozen=["head"], param_groups=[{"params": ["head.weight"]}])


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"loss": "cross_entropy"}, TypeError, r"^loss must be an ortlstm\.graphs\.losses\.Loss, got str "
         r"'cross_entropy'; pass loss=Loss\.cross_entropy\(\)"),
        ({"optimizer": "adamw"}, TypeError, r"got str 'adamw'; pass optimizer=AdamW\(lr=1e-3\)"),
        ({"optimizer": optimizers.NAdam}, TypeError, r"got the class .*; pass optimizer=NAdam\(lr=1e-3\)"),
        ({"lr": "0.1"}, TypeError, r"^lr must be a number or a schedule f\(done\) -> lr, got str '0\.1'$"),
        ({"lr": -1.0}, ValueError, r"^Invalid learning rate: -1\.0$"),
        ({"threads": "2"}, TypeError, r"^threads must be an int >= 0 .* or None, got '2'$"),
        ({"stateful": "yes"}, TypeError, r"^stateful must be True or False, got str 'yes'$"),
        ({"clip_grad_norm": -1.0}, ValueError, r"^clip_grad_norm must be a number >= 0 .*, got -1\.0; a negative one "
         r"would flip the gradients' sign"),
        ({"clip_grad_norm": "1"}, ValueError, r"^clip_grad_norm must be a number >= 0"),
        ({"output": 0}, TypeError, r"^output must be a name \(a string\), got int 0$"),
        ({"fixed_shapes": [6, 4, 3]}, TypeError, r"^fixed_shapes must be a mapping of input name -> value, got list "
         r"\[6, 4, 3\]; pass e\.g\. fixed_shapes=\{'x': \[None, 40, 1\]\}$"),
        ({"fixed_inputs": "x"}, TypeError, r"^fixed_inputs must be a mapping of input name -> value, got str 'x'"),
        ({"lr": lambda: 0.1}, TypeError, r"^lr: a schedule is called with the number of updates done \(lr\(0\) for "
         r"the first\), but .* cannot take one argument; pass e\.g\. lr=lambda done: 1e-3 \* 0\.95 \*\* done$"),
        ({"ir_version": "10"}, TypeError, r"^ir_version must be an int \(e\.g\. \d+\), got '10'$"),
        ({"clip_grad_norm": 1.0, "clip_norm_type": "inf"}, ValueError, r"norm_type must be positive or inf, got 'inf'"),
    ],
)
def test_trainer_options_of_the_wrong_type_are_refused_before_building(
    options: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        _trainer(**options)


def test_a_negative_max_norm_is_refused_where_clipping_is_defined() -> None:
    with pytest.raises(ValueError, match="flip the gradients' sign"):
        ClipGradNorm(-0.5)
    assert ClipGradNorm(0.0).max_norm == 0.0  # torch's max_norm=0 zeroes the gradients: allowed
    assert ClipGradNorm(np.float32(1.0)).max_norm == 1.0


@pytest.mark.parametrize("name", sorted(optimizers.OPTIMIZERS))
def test_every_optimizer_refuses_a_hyperparameter_of_another_type(name: str) -> None:
    cls = optimizers.OPTIMIZERS[name]
    with pytest.raises(TypeError, match=rf"^{name}: lr must be a number, e\.g\. lr=.* \(torch's default\), got str "
                       r"'abc'$"):
        cls(lr="abc")
    with pytest.raises(TypeError, match=rf"^{name}: maximize must be True or False, .*got str 'no'$"):
        cls(maximize="no")
    assert cls(lr=np.float32(0.5)).lr == 0.5  # NumPy numbers are numbers


@pytest.mark.parametrize("betas", [3, 0.9, "0.9,0.99", (0.9,), (0.9, "0.99")])
def test_adam_betas_that_are_not_two_numbers_are_refused(betas: Any) -> None:
    with pytest.raises(TypeError, match=r"^Adam: betas must be two numbers, e\.g\. betas=\(0\.9, 0\.999\) \(torch's "
                       r"default\), got "):
        optimizers.Adam(betas=betas)


def test_a_refused_update_names_the_gradients_by_their_torch_names() -> None:
    trainer = _trainer()
    x = np.full((6, 4, 3), np.nan, np.float32)
    with pytest.raises(NonFiniteStepError, match=r"the gradients of \[.*'lstm\.weight_ih_l0 \(onnx: val_41\)', .*"
                       r"'lstm\.bias_hh_l0 \+ lstm\.bias_ih_l0 \(onnx: val_64\)'.*\] hold NaN or inf") as error:
        trainer.step(x, target=np.zeros(6, np.int64))
    assert "val_41" in error.value.nonfinite_grads  # the attribute keeps the initializer names


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--optimizer", "adam", "--optimizer-option", "betas=3"], "Adam: betas must be two numbers"),
        (["--optimizer", "adam", "--optimizer-option", "lr=abc"], "Adam: lr must be a number"),
        (["--optimizer", "sgd", "--clip-grad-norm", "-1"], "clip_grad_norm must be a number >= 0"),
        (
            ["--optimizer", "sgd", "--frozen", "head", "--param-groups", '[{"params": ["head.bias"]}]'],
            "'head.bias' names only parameters that are not trained",
        ),
    ],
)
def test_the_command_line_says_the_same_in_one_line(
    options: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "train.npz"
    np.savez(data, x=np.zeros((6, 4, 3), np.float32), target=np.zeros(6, np.int64))
    argv = ["fit", str(MODEL_PATH), "--data", str(data), "--loss", "cross_entropy", "--batch-size", "6"]
    argv += ["--epochs", "1", *options]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("ortlstm fit: error: ") and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(("flag", "example"), [("--checkpoint", "run.safetensors"), ("--plot", "curves.png")])
def test_fit_refuses_a_directory_where_it_writes_a_file_before_training(
    flag: str, example: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "train.npz"
    np.savez(data, x=np.zeros((6, 4, 3), np.float32), target=np.zeros(6, np.int64))
    folder = tmp_path / "runs"
    folder.mkdir()
    argv = ["fit", str(MODEL_PATH), "--data", str(data), "--loss", "cross_entropy", "--optimizer", "sgd"]
    assert main([*argv, "--batch-size", "6", "--epochs", "1", flag, str(folder)]) == 1
    # Before: "--checkpoint runs: runs exists: pass --resume to continue that run" and --plot's example a .onnx file.
    assert capsys.readouterr().err == (
        f"ortlstm fit: error: {flag} {folder}: a directory; pass the file to write (e.g. {folder / example})\n"
    )
    assert list(folder.iterdir()) == []


def test_distributed_save_keeps_an_existing_checkpoints_mode(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    from ortlstm.distributed import DistributedTrainer

    path = tmp_path / "run.safetensors"
    path.write_bytes(b"old")
    os.chmod(path, 0o640)
    trainer = DistributedTrainer(_trainer(threads=1))
    trainer.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    restored = _trainer(threads=1)
    restored.load(path)
    assert restored.global_step == 0
    assert [p.name for p in tmp_path.iterdir()] == ["run.safetensors"]  # no partial file left beside it


BATCH = np.zeros((6, 4, 3), np.float32)
LABELS = np.zeros(6, np.int64)


@pytest.mark.parametrize(
    ("args", "named", "message"),
    [
        ((BATCH[:0],), {"target": LABELS[:0]}, r"^step\(\): input 'x' holds no samples \(shape \[0, 4, 3\], axis 0 "
         r"is 0\); a step or evaluation needs at least one \(torch's mean over an empty batch is nan\): "
         r"skip the batch$"),
        (({"x": BATCH},), {"target": LABELS}, r"^step\(\): input 'x' is a dict of \['x'\]; pass arrays by name "
         r"instead: step\(\*\*batch\) or step\(x=\.\.\., target=\.\.\.\)$"),
        ((BATCH.tolist(),), {"target": LABELS}, r"^step\(\): input 'x' must be float32 \[.*\], got float64 "
         r"\[6, 4, 3\]; pass np\.asarray\(\.\.\., np\.float32\)$"),
        (([[1.0, 2.0], [3.0]],), {"target": LABELS}, r"^step\(\): input 'x' is not an array of numbers \(.*\); "
         r"pass a NumPy array$"),
        ((BATCH,), {"target": "abc"}, r"^step\(\): target is not numbers: got str 'abc'; pass a NumPy array$"),
        ((BATCH, LABELS), {}, r"^step\(\): 2 positional inputs, but the model has 1: \['x'\]; the target goes by "
         r"keyword: target=\.\.\.$"),
    ],
)
def test_a_batch_that_is_not_arrays_of_samples_is_refused_naming_the_input(
    args: tuple[Any, ...], named: dict[str, Any], message: str
) -> None:
    trainer = _trainer()
    with pytest.raises(ValueError, match=message):
        trainer.step(*args, **named)
    assert trainer.global_step == 0


@pytest.mark.parametrize("where", ["directory", "missing directory"])
def test_save_to_a_directory_or_into_a_missing_one_says_so_and_writes_nothing(where: str, tmp_path: Path) -> None:
    trainer = _trainer()
    target = tmp_path / "runs" if where == "directory" else tmp_path / "missing" / "run.safetensors"
    if where == "directory":
        target.mkdir()
    error = IsADirectoryError if where == "directory" else FileNotFoundError
    message = r"is a directory: pass a file path, e\.g\. .*run\.safetensors$" if where == "directory" else (
        r"^cannot write .*run\.safetensors: no directory .*missing \(create it first\)$"
    )
    with pytest.raises(error, match=message):
        trainer.save(target)
    assert sorted(path.name for path in tmp_path.rglob("*")) == (["runs"] if where == "directory" else [])


def test_loading_a_checkpoint_of_another_optimizer_names_the_optimizers_only(tmp_path: Path) -> None:
    path = tmp_path / "run.safetensors"
    _trainer(optimizer=optimizers.AdamW(lr=1e-3)).save(path)
    # Before: every field of both optimizers (optimizer.momentum=None and optimizer.dampening=None and ...).
    with pytest.raises(ValueError, match=r": the checkpoint was saved with optimizer\.name=AdamW, this trainer has "
                       r"optimizer\.name=SGD \(build the Trainer with the same options"):
        _trainer().load(path)


def test_nan_in_the_validation_set_under_skip_says_it_is_evaluated_not_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "train.npz", x=rng.standard_normal((6, 4, 3)).astype(np.float32), target=LABELS)
    val_x = rng.standard_normal((6, 4, 3)).astype(np.float32)
    val_x[2, 1, 0] = np.nan
    np.savez(tmp_path / "val.npz", x=val_x, target=LABELS)
    argv = ["fit", str(MODEL_PATH), "--data", str(tmp_path / "train.npz"), "--val", str(tmp_path / "val.npz")]
    argv += ["--loss", "cross_entropy", "--optimizer", "sgd", "--batch-size", "6", "--epochs", "1"]
    assert main([*argv, "--nonfinite", "skip"]) == 0
    lines = capsys.readouterr().err.splitlines()
    # Before: "--nonfinite skip: each batch holding one is skipped", which fit does to training batches only.
    assert lines[0] == (
        f"ortlstm fit: warning: {tmp_path / 'val.npz'}: array 'x' holds NaN or inf in 1 of 6 samples (the first: "
        "sample 2); --nonfinite skip: the validation set is evaluated as it is, so its loss will not be finite "
        "(each epoch's warning counts the samples)"
    )
    assert "the validation loss is nan: 1 of 6 samples has a loss that is not finite (the first: sample 2)" in lines[-1]


def test_a_class_loss_on_a_regressors_one_axis_output_says_what_torch_makes_of_it() -> None:
    # A regressor's output [batch] (x @ w with w [3]), given cross_entropy by mistake: torch reads a
    # 1-D input as the classes of one unbatched sample, so its target is 0-D and the labels [batch] do not fit.
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "regressor",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
        [numpy_helper.from_array(np.ones(3, np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    trainer = Trainer(model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.1))
    hint = (
        r"the prediction \[(batch|4)\] has one axis, which torch's cross_entropy reads as the classes of one unbatched "
        r"sample: a classifier's output is \[batch, classes\], and a regressor's \[batch\] output needs a regression "
        r"loss \(mse_loss, l1_loss, \.\.\.\)"
    )
    x = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"expects class indices int64 \[\] .*got int64 \[4\]; " + hint + "$"):
        trainer.step(x, target=np.zeros(4, np.int64))
    with pytest.raises(ValueError, match=r"got float32 \[4\]; " + hint + r"; class probabilities need"):
        trainer.step(x, target=np.zeros(4, np.float32))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: losses.Loss.cross_entropy(ignore_index="a"), r"^cross_entropy: ignore_index must be an int, e\.g\. "
         r"ignore_index=-100 \(torch's default\), got str 'a'$"),
        (lambda: losses.Loss.cross_entropy(label_smoothing="0.1"), r"^cross_entropy: label_smoothing must be a number"),
        (lambda: losses.Loss.ctc_loss(zero_infinity="yes"), r"^ctc_loss: zero_infinity must be True or False"),
    ],
)
def test_a_loss_option_of_another_type_is_refused_naming_it(make: Any, message: str) -> None:
    # Before: accepted, to fail (or not) somewhere in the graph; label_smoothing="0.1": '<=' not supported ...
    with pytest.raises(TypeError, match=message):
        make()


def test_fit_takes_torchs_class_names_and_learning_rate_with_a_deprecation_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The README: "the older spellings (--loss CrossEntropyLoss, --optimizer AdamW, ..., --learning-rate) still
    # work and print a deprecation warning"; fit and train-step refused them ("invalid choice: 'AdamW'").
    np.savez(tmp_path / "train.npz", x=np.zeros((6, 4, 3), np.float32), target=LABELS)
    argv = ["fit", str(MODEL_PATH), "--data", str(tmp_path / "train.npz"), "--batch-size", "6", "--epochs", "1"]
    assert main([*argv, "--loss", "CrossEntropyLoss", "--optimizer", "AdamW", "--learning-rate", "0.01"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "ortlstm fit: warning: --loss CrossEntropyLoss is deprecated; use --loss cross_entropy",
        "ortlstm fit: warning: --optimizer AdamW is deprecated; use --optimizer adamw",
        "ortlstm fit: warning: --learning-rate is deprecated; use --lr",
    ]
    assert "lr 0.01" in captured.out
