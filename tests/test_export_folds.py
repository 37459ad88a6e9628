"""What torch's exporters fold away never makes training differ from torch's (issue 31).

Five minimal models (tests/recordings/record_folds.py), each exported three ways: dynamo's
default (``optimize=True``), dynamo with ``optimize=False`` and TorchScript. Each export, trained
through ``Trainer`` in plain onnxruntime without torch on torch's batches, either matches torch's
parameters after every step (each ONNX initializer compared with the torch parameter it is, or a
transpose of it, as their initial values show) or is refused / warned with the reason and the
export option that avoids it:

- ``rnn_fold``: dynamo's optimizer folds step 0's ``h0 @ W_hh^T + b_hh`` (zero h0) into one
  initializer; it is rebuilt from ``rnn.bias_hh_l0`` in the train step, so b_hh's gradient has
  step 0's term;
- ``embedding_pad``: ``nn.Embedding(padding_idx=0)``: the padding row gets no gradient (torch's
  weight decay and momentum still act on it: SGD and Adam add ``weight_decay * p`` to its zero
  gradient, AdamW decays it);
- ``conv_bn``: a BatchNorm folded into its Conv (TorchScript in eval mode, dynamo's optimizer):
  warned, and never named as the Conv's weight;
- ``merged_norms``: two fresh LayerNorms whose equal weights the exporter merged: untied, one
  trained copy per torch parameter;
- ``tied_embedding``: an Embedding's table tied to a Linear's weight, whose transpose the
  exporters fold into a tensor of its own: recomputed from the table, so the tie trains as one.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
import pytest

from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.export_metadata import FxCall, fx_call
from ortlstm.training import Trainer

DATA = Path(__file__).parent / "data" / "folds"
RECORDINGS = Path(__file__).parent / "recordings" / "folds"
EXPORTERS = ("dynamo", "dynamo_unoptimized", "torchscript")
# Three float32 optimizer steps of a model of a few dozen values.
RTOL, ATOL = 1e-5, 1e-6


def recording(case: str, optimizer: str) -> dict[str, np.ndarray]:
    with np.load(RECORDINGS / f"{case}-{optimizer}.npz") as data:
        return dict(data)


def trainer(case: str, exporter: str, optimizer: str) -> Trainer:
    arrays = recording(case, optimizer)
    config = json.loads(arrays["config"].tobytes())
    return Trainer(
        str(DATA / f"{case}-{exporter}.onnx"),
        loss=losses.Loss.mse_loss(),
        optimizer=optimizers.optimizer_from_torch(config["optimizer"], **config["kwargs"]),
    )


def torch_counterparts(run: Trainer, arrays: dict[str, np.ndarray]) -> dict[str, tuple[str, bool]]:
    """Each trained initializer -> the torch parameter it holds and whether transposed, by initial values."""
    initial = {key.split("/")[1]: value for key, value in arrays.items() if key.endswith("/initial")}
    found: dict[str, tuple[str, bool]] = {}
    for name, value in run.parameters.items():
        if name in initial:  # by name first: equal fresh values (two LayerNorms) are ambiguous
            assert np.array_equal(initial[name], value), name
            found[name] = (name, False)
            continue
        for torch_name, torch_value in initial.items():
            if torch_value.shape == value.shape and np.array_equal(torch_value, value):
                found[name] = (torch_name, False)
            elif torch_value.ndim == 2 and torch_value.T.shape == value.shape and np.array_equal(torch_value.T, value):
                found[name] = (torch_name, True)
    return found


def replay(run: Trainer, case: str, optimizer: str, compared: tuple[str, ...] = ()) -> None:
    """Trains ``run`` on torch's batches; every parameter matches torch's after every step.

    ``compared``: only these torch parameters have a counterpart to compare (TorchScript's LSTM
    weights are torch's with the gates reordered); the others are trained all the same.
    """
    arrays = recording(case, optimizer)
    counterparts = torch_counterparts(run, arrays)
    if compared:
        assert sorted(torch for torch, _ in counterparts.values()) == sorted(compared), counterparts
    else:  # every torch parameter is trained exactly once (nothing merged, nothing folded into a copy)
        assert sorted(torch for torch, _ in counterparts.values()) == sorted(
            key.split("/")[1] for key in arrays if key.endswith("/initial")
        ), counterparts
    step = 0
    while f"batch/{step}/x" in arrays:
        loss = run.step(arrays[f"batch/{step}/x"], target=arrays[f"target/{step}"])
        np.testing.assert_allclose(loss, arrays[f"loss/{step}"], rtol=RTOL, atol=ATOL)
        for name, value in run.parameters.items():
            if name not in counterparts:
                continue
            torch_name, transposed = counterparts[name]
            expected = arrays[f"param/{torch_name}/{step}"]
            np.testing.assert_allclose(
                value, expected.T if transposed else expected, rtol=RTOL, atol=ATOL, err_msg=f"{name} step {step}"
            )
        step += 1
    assert step == 3


def build(case: str, exporter: str, optimizer: str = "Adam") -> tuple[Trainer, list[str]]:
    """The trainer and the warnings its construction gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = trainer(case, exporter, optimizer)
    return run, [str(warning.message) for warning in caught]


def exported_matches_trainer(run: Trainer, case: str, optimizer: str) -> None:
    """The exported model, run by plain onnxruntime without the library, predicts what the trainer does."""
    import onnxruntime as ort

    arrays = recording(case, optimizer)
    x = arrays["batch/0/x"]
    exported = run.export()
    session = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    (from_export,) = session.run(None, {"x": x})
    _, from_trainer = run.evaluate(x, target=arrays["target/0"], outputs=["y"])
    np.testing.assert_allclose(from_export, from_trainer, rtol=1e-6, atol=1e-7)


# ---- 1. an initializer folded from parameters the graph also trains ---------------------------------


@pytest.mark.parametrize("optimizer", ["Adam", "SGD"])
@pytest.mark.parametrize("exporter", ["dynamo", "dynamo_unoptimized"])
def test_rnn_step_zero_folded_by_dynamo_trains_as_torch(exporter, optimizer):
    run, caught = build("rnn_fold", exporter, optimizer)
    assert caught == []
    # dynamo folds h0 @ W_hh^T + b_hh (h0 = 0) into 'linear_1' [1, 2, 4]: recomputed from b_hh, never trained.
    assert "linear_1" not in run.parameters
    replay(run, "rnn_fold", optimizer)
    exported_matches_trainer(run, "rnn_fold", optimizer)


def test_rnn_torchscript_export_trains_as_torch():
    """TorchScript writes the ONNX RNN node (RNNTraining / RNNGrad); its W, R, B are torch's stacked."""
    run, caught = build("rnn_fold", "torchscript")
    assert caught == []
    replay(run, "rnn_fold", "Adam", ("head.weight", "head.bias"))
    arrays = recording("rnn_fold", "Adam")
    last = {key.split("/")[1]: arrays[key] for key in arrays if key.startswith("param/") and key.endswith("/2")}
    stacked = {
        (1, 4, 3): last["rnn.weight_ih_l0"][None],
        (1, 4, 4): last["rnn.weight_hh_l0"][None],
        (1, 8): np.concatenate([last["rnn.bias_ih_l0"], last["rnn.bias_hh_l0"]])[None],
    }
    rnn_parameters = {name: value for name, value in run.parameters.items() if not name.startswith("head.")}
    assert sorted(value.shape for value in rnn_parameters.values()) == sorted(stacked)
    for name, value in rnn_parameters.items():
        np.testing.assert_allclose(value, stacked[value.shape], rtol=RTOL, atol=ATOL, err_msg=name)


def test_folded_initializer_of_another_value_is_refused_with_the_export_option(tmp_path):
    model = onnx.load(DATA / "rnn_fold-dynamo.onnx")
    folded = next(init for init in model.graph.initializer if init.name == "linear_1")
    value = onnx.numpy_helper.to_array(folded).copy()
    value[0, 1] += 0.5  # h0 @ W_hh^T + b_hh of a non-zero h0: not a broadcast of b_hh any more
    folded.CopyFrom(onnx.numpy_helper.from_array(value, "linear_1"))
    with pytest.raises(ValueError) as refusal:
        Trainer(model, loss=losses.Loss.mse_loss(), optimizer=optimizers.optimizer_from_torch("SGD", lr=0.1))
    message = str(refusal.value)
    assert "initializer 'linear_1' [1, 2, 4] was folded by the exporter's optimizer from torch parameters " in message
    assert "['rnn.bias_hh_l0', 'rnn.weight_hh_l0']" in message
    assert "optimize=False" in message and "dynamic batch" in message
    # Fine-tuning the head alone trains nothing the fold touches.
    head = Trainer(
        model,
        loss=losses.Loss.mse_loss(),
        optimizer=optimizers.optimizer_from_torch("SGD", lr=0.1),
        frozen=["rnn", "linear_1"],
    )
    assert sorted(head.parameters) == ["head.bias", "head.weight"]


# ---- 2. nn.Embedding(padding_idx=0) ------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["Adam", "SGD", "AdamW"])
@pytest.mark.parametrize("exporter", ["dynamo", "dynamo_unoptimized"])
def test_embedding_padding_row_trains_as_torch(exporter, optimizer):
    run, caught = build("embedding_pad", exporter, optimizer)
    assert caught == []
    replay(run, "embedding_pad", optimizer)


def test_embedding_padding_row_gets_exactly_zero_gradient():
    run, _ = build("embedding_pad", "dynamo")
    arrays = recording("embedding_pad", "Adam")
    run.accumulate(arrays["batch/0/x"], target=arrays["target/0"])
    gradient = run.accumulated_gradients["emb.weight"]
    assert np.all(gradient[0] == 0.0)
    assert np.all(np.abs(gradient[1:]).sum(axis=1)[np.unique(arrays["batch/0/x"])[1:] - 1] > 0)


@pytest.mark.parametrize("optimizer", ["Adam", "SGD", "AdamW"])
def test_padding_row_moves_only_by_weight_decay_and_momentum(optimizer):
    """torch's rule, in formulas: no gradient, but SGD adds weight_decay * p to it and AdamW decays p."""
    run, _ = build("embedding_pad", "dynamo", optimizer)
    arrays = recording("embedding_pad", optimizer)
    row = arrays["param/emb.weight/initial"][0]
    run.step(arrays["batch/0/x"], target=arrays["target/0"])
    kwargs = json.loads(arrays["config"].tobytes())["kwargs"]
    lr, decay = kwargs["lr"], kwargs.get("weight_decay", 0.0)
    # step 1: SGD's momentum buffer is the gradient, 0 + decay * p; AdamW multiplies p by 1 - lr * decay.
    np.testing.assert_allclose(run.parameters["emb.weight"][0], row * (1 - lr * decay), rtol=1e-6)


def test_torchscript_embedding_is_warned_about_padding_idx():
    run, caught = build("embedding_pad", "torchscript")
    assert len(caught) == 1
    assert caught[0].startswith(
        "Gather '/emb/Gather' reads 'emb.weight' [6, 4] as an embedding table indexed by input 'x'"
    )
    assert "padding_idx" in caught[0] and "dynamo=True" in caught[0]
    assert "emb.weight" in run.parameters  # trained, every row: the export cannot say


# ---- 3. BatchNorm folded into its Conv -------------------------------------------------------------


def test_conv_batchnorm_kept_apart_trains_as_torch():
    run, caught = build("conv_bn", "dynamo_unoptimized")
    assert caught == []
    assert {"conv.weight", "conv.bias", "bn.weight", "bn.bias"} <= set(run.parameters)
    replay(run, "conv_bn", "Adam")


def test_conv_batchnorm_fused_by_dynamo_is_warned_and_summarized_as_fused():
    run, caught = build("conv_bn", "dynamo")
    assert len(caught) == 1
    assert caught[0].startswith("the export folded a BatchNorm into the Conv before it: ['conv.bias', 'conv.weight']")
    assert "['bn.bias', 'bn.weight', 'conv.bias', 'conv.weight']" in caught[0] and "optimize=False" in caught[0]
    row = next(line for line in run.summary().splitlines() if line.strip().startswith("conv.weight"))
    assert row.endswith("<- conv.weight, bn.weight, bn.bias")


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_frozen_fused_conv_is_not_warned_about(exporter):
    fused = ["conv.weight", "conv.bias"] if exporter == "dynamo" else ["onnx::Conv_17", "onnx::Conv_18"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Trainer(
            str(DATA / f"conv_bn-{exporter}.onnx"),
            loss=losses.Loss.mse_loss(),
            optimizer=optimizers.optimizer_from_torch("Adam", lr=0.05),
            frozen=fused,
        )


def test_conv_batchnorm_fused_by_torchscript_is_warned():
    run, caught = build("conv_bn", "torchscript")
    assert len(caught) == 1
    assert caught[0].startswith("Conv weights ['onnx::Conv_17'] are not torch parameters of the TorchScript export")
    assert "do_constant_folding=False" in caught[0]
    assert "model.train()" in caught[0] and "TrainingMode.TRAINING" in caught[0]
    assert "conv.weight" not in run.summary()


# ---- 4. equal-valued parameters merged -------------------------------------------------------------


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_merged_layernorm_parameters_are_untied_and_train_as_torch(exporter):
    run, caught = build("merged_norms", exporter)
    if exporter == "torchscript":
        assert caught == [
            "the TorchScript export writes 'ln2.bias' = Identity('ln1.bias'), 'ln2.weight' = Identity('ln1.weight'): "
            "it stores equal-valued parameters once, so each is trained here as a tensor of its own, as torch trains "
            "two parameters of equal values. If the model ties them (one nn.Parameter in two modules), export with "
            "torch.onnx.export(..., dynamo=True), whose metadata tells a tie from equal values."
        ]
    else:
        assert caught == []  # dynamo's "not in the export" warning is gone: they are
    assert {"ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"} <= set(run.parameters)
    replay(run, "merged_norms", "Adam")
    exported_matches_trainer(run, "merged_norms", "Adam")
    exported = {init.name for init in run.export().graph.initializer}
    assert {"ln1.weight", "ln2.weight", "ln1.bias", "ln2.bias"} <= exported


def test_fx_call_reads_the_torch_call_and_its_arguments():
    model = onnx.load(DATA / "merged_norms-dynamo.onnx")
    call = fx_call(next(node for node in model.graph.node if node.op_type == "LayerNormalization"))
    arguments = ("%linear", "[4]", "%p_ln1_weight", "%p_ln1_bias", "1e-05", "False")
    assert call == FxCall("torch.ops.aten.layer_norm.default", arguments)
    assert call.placeholders() == ("linear", "p_ln1_weight", "p_ln1_bias")
    assert fx_call(onnx.helper.make_node("Relu", ["x"], ["y"])) is None


# ---- a weight tied between two modules, which an exporter folds a transpose of -----------------------


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_tied_embedding_and_linear_weight_train_as_one(exporter):
    """``head.weight = emb.weight``: torch trains one tensor; the exports hold it and a folded W^T."""
    run, caught = build("tied_embedding", exporter, "SGD")
    # dynamo names the table by its tie's placeholder; its "not in the export" warning would be false.
    assert [message for message in caught if "not in the export" in message] == []
    tables = [name for name in run.parameters if name.endswith(".weight") and not name.startswith("out.")]
    assert len(tables) == 1, sorted(run.parameters)
    replay(run, "tied_embedding", "SGD")
    exported_matches_trainer(run, "tied_embedding", "SGD")


# ---- a parameter expanded over a static batch, folded with the LSTM's weights ------------------------


@pytest.mark.parametrize("exporter", ["dynamo_unoptimized", "torchscript"])
def test_lstm_initial_state_parameter_trains_as_torch(exporter):
    run, caught = build("lstm_state", exporter)
    assert caught == []
    compared = ("h0", "c0", "head.weight", "head.bias") if exporter == "torchscript" else ()
    replay(run, "lstm_state", "Adam", compared)


def test_lstm_initial_state_folded_over_a_static_batch_is_refused():
    with pytest.raises(ValueError) as refusal:
        build("lstm_state", "dynamo")
    message = str(refusal.value)
    assert message.startswith("initializer 'val_14' [1, 2, 4] was folded by the exporter's optimizer from torch ")
    assert "its value repeats along axis 1 (size 2): a parameter expanded over a static batch" in message
    assert "optimize=False" in message and "dynamic batch (dynamic_shapes=...)" in message


def test_parameter_expanded_over_a_static_batch_alone_is_refused():
    """c0 folded into val_15 [1, 2, 4] shares no parameter; its copies would still train apart."""
    with pytest.raises(ValueError) as refusal:
        Trainer(
            str(DATA / "lstm_state-dynamo.onnx"),
            loss=losses.Loss.mse_loss(),
            optimizer=optimizers.optimizer_from_torch("Adam", lr=0.05),
            frozen=["h0", "val_39", "val_40", "val_62"],
        )
    message = str(refusal.value)
    assert message.startswith(
        "initializer 'val_15' [1, 2, 4] was folded by the exporter's optimizer from torch parameters ['c0']; its value "
        "repeats along axis 1 (size 2)"
    )
    assert message.endswith("(dynamic_shapes=...), which keep that computation in the graph; or freeze 'val_15'.")


def test_a_bias_free_conv_with_a_batchnorm_fused_by_dynamo_is_warned_not_refused():
    """Conv2d(bias=False) + BatchNorm2d (eval), dynamo's default export: warned, not refused.

    The fusion writes a new bias ``conv.weight_bias`` folded from bn.weight and bn.bias, which the
    fused conv.weight also stands for.

    That is the fused Conv+BN case (warned), not a fold shared with a trained tensor (refused):
    before, easyocr's english_g2 exported this way was refused over ``ConvNet.11.weight_bias``.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = Trainer(
            str(DATA / "conv_nobias_bn-dynamo.onnx"),
            loss=losses.Loss.cross_entropy(),
            optimizer=optimizers.optimizer_from_torch("SGD", lr=0.1),
        )
    messages = [str(warning.message) for warning in caught]
    assert len(messages) == 1, messages
    assert messages[0].startswith(
        "the export folded a BatchNorm into the Conv before it: ['conv.weight', 'conv.weight_bias']"
    )
    assert {"conv.weight", "conv.weight_bias"} <= set(run.parameters)
    x = np.random.default_rng(0).standard_normal((2, 2, 6, 6)).astype(np.float32)
    assert np.isfinite(float(run.step(x, target=np.array([0, 2], np.int64))))
