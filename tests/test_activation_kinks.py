"""Activation gradients against torch's, at the kinks too (recorded: tests/recordings/record_activations.py).

Finite differences (tests/test_autodiff_activation_rules.py) cannot say which side a rule takes
where the derivative jumps; torch's ``*_backward`` kernels decide that, and users replaying a
torch run meet those points (a ReLU input at exactly 0, a Hardswish input clipped to -3). For each
activation torch exports as one ONNX op, the recording holds X (its kinks and random points), a
gradient dY, and torch's Y and dX in float32; here the ONNX op runs in onnxruntime and the rule
differentiates it, without torch. Second, each torch layer that exports as one op (GELU, Mish,
Hardswish, SELU, CELU, PReLU, ReLU6 and Hardtanh as Clip, GroupNorm at opset 21, RMSNorm at
opset 23), its kinks among the input's values, as the dynamo exporter
wrote it, with random parameters: its input and parameter gradients (parameters found by the
torch names the export's metadata gives, PReLU's slope reshaped by the exporter) against torch's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from gradcheck import runs_opset
from onnx import TensorProto, helper

import ortlstm.ops
from ortlstm.graphs.autodiff import (
    GraphEmitter,
    build_backward,
    gradient_rule,
    infer_value_types,
    onnx_opset,
    registered_ops,
)
from ortlstm.graphs.emit.emitter import used_names
from ortlstm.graphs.export_metadata import read_torch_origins

RECORDING = Path(__file__).parent / "recordings" / "activations.npz"

with np.load(RECORDING) as _data:
    ARRAYS = {key: _data[key] for key in _data.files}
CONFIGS: dict[str, dict[str, Any]] = json.loads(ARRAYS.pop("configs").tobytes().decode())["cases"]


def _run(name: str) -> dict[str, np.ndarray]:
    """Y and the rule's gradients of ``name``'s op on the recorded X (and slope) with dY seeded."""
    config = CONFIGS[name]
    x = ARRAYS[f"{name}/x"]
    wrt = ["X", "slope"] if config["op_type"] == "PRelu" else ["X"]
    inputs = [
        helper.make_tensor_value_info(value, TensorProto.FLOAT, ARRAYS[f"{name}/{value.lower()}"].shape)
        for value in wrt
    ]
    inputs.append(helper.make_tensor_value_info("dY", TensorProto.FLOAT, x.shape))
    node = helper.make_node(config["op_type"], wrt, ["Y"], name=name, **config["attributes"])
    graph = helper.make_graph([node], name, inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, x.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", config["opset"])], ir_version=10)
    emitter = GraphEmitter(onnx_opset(model), used_names(model.graph), infer_value_types(model))
    gradients = build_backward(model.graph, {"Y": "dY"}, wrt, emitter).gradients
    model.graph.node.extend(emitter.nodes)
    model.graph.initializer.extend(emitter.initializers)
    model.graph.output.extend(helper.make_empty_tensor_value_info(gradients[value]) for value in wrt)
    session = ort.InferenceSession(
        model.SerializeToString(), ortlstm.ops.session_options(), providers=["CPUExecutionProvider"]
    )
    feeds = {value: ARRAYS[f"{name}/{value.lower()}"] for value in wrt} | {"dY": ARRAYS[f"{name}/dy"]}
    values = session.run(None, feeds)
    return {"y": values[0], "dx": values[1], **({"dslope": values[2]} if len(values) > 2 else {})}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_gradient_is_torchs_at_the_kinks_and_elsewhere(name: str) -> None:
    config = CONFIGS[name]
    x = ARRAYS[f"{name}/x"].reshape(-1)
    assert all(np.any(x == kink) for kink in config["kinks"]), "the recording holds every kink"
    got = _run(name)
    for key, value in got.items():
        expected = ARRAYS[f"{name}/{key}"]
        message = f"{name} ({config['op_type']}): {key}"
        np.testing.assert_allclose(value, expected, rtol=2e-6, atol=2e-6, err_msg=message)


def test_the_kinks_decide_something() -> None:
    """The recording is not trivial: at some kink torch's gradient is neither side's limit average."""
    for name, expected in [("hardswish", 0.0), ("relu", 0.0)]:
        x, dx = ARRAYS[f"{name}/x"].reshape(-1), ARRAYS[f"{name}/dx"].reshape(-1)
        first_kink = CONFIGS[name]["kinks"][0]
        assert dx[x == first_kink][0] == expected, name
    # LeakyReLU and ELU take the negative side at 0: slope * dY, not dY.
    for name, slope in [("leaky_relu", 0.125), ("elu", 0.75)]:
        x, dx, dy = (ARRAYS[f"{name}/{key}"].reshape(-1) for key in ("x", "dx", "dy"))
        np.testing.assert_allclose(dx[x == 0.0], slope * dy[x == 0.0], rtol=1e-6, err_msg=name)


def test_the_recording_covers_every_activation_rule() -> None:
    recorded = {config["op_type"] for config in CONFIGS.values()}
    of_the_module = {
        op_type
        for domain, op_type in registered_ops()
        if gradient_rule(domain, op_type).rule.__module__.endswith(".rules_activations")  # type: ignore[union-attr]
    }
    assert of_the_module, "rules_activations registers rules"
    missing = sorted(of_the_module - recorded)
    assert not missing, f"no torch recording for {missing}: add them to tests/recordings/record_activations.py"


# ---- the layers as torch exports them (one op each), parameters included ----------------------------

LAYERS = Path(__file__).parent / "recordings" / "activation_layers.npz"

with np.load(LAYERS) as _data:
    LAYER_ARRAYS = {key: _data[key] for key in _data.files}
LAYER_NAMES = sorted({key.split("/", 1)[0] for key in LAYER_ARRAYS})


def _layer_param(name: str) -> object:
    model = onnx.load_from_string(LAYER_ARRAYS[f"{name}/model"].tobytes())
    opset = onnx_opset(model)
    lacking = not runs_opset(opset)
    return pytest.param(name, id=name, marks=[pytest.mark.skipif(lacking, reason=f"this onnxruntime lacks {opset}")])


@pytest.mark.parametrize("name", [_layer_param(name) for name in LAYER_NAMES])
def test_exported_layer_gradients_are_torchs(name: str) -> None:
    """The export's input and every parameter (by the torch name its metadata gives) get torch's gradient."""
    model = onnx.load_from_string(LAYER_ARRAYS[f"{name}/model"].tobytes())
    (x,) = [value.name for value in model.graph.input]
    origins = read_torch_origins(model)
    assert origins is not None, "a dynamo export records its parameters"
    initializers = [init.name for init in model.graph.initializer]  # parameters, and Clip's bounds
    parameters = {name: origins.sources[name][0] for name in initializers if name in origins.sources}
    model.graph.input.append(helper.make_tensor_value_info("dY", TensorProto.FLOAT, LAYER_ARRAYS[f"{name}/dy"].shape))
    (y,) = [value.name for value in model.graph.output]
    emitter = GraphEmitter(onnx_opset(model), used_names(model.graph), infer_value_types(model))
    gradients = build_backward(model.graph, {y: "dY"}, [x, *parameters], emitter).gradients
    model.graph.node.extend(emitter.nodes)
    model.graph.initializer.extend(emitter.initializers)
    wanted = {"x": gradients[x]} | {torch_name: gradients[onnx_name] for onnx_name, torch_name in parameters.items()}
    model.graph.output.extend(helper.make_empty_tensor_value_info(value) for value in wanted.values())
    session = ort.InferenceSession(
        model.SerializeToString(), ortlstm.ops.session_options(), providers=["CPUExecutionProvider"]
    )
    values = session.run(None, {x: LAYER_ARRAYS[f"{name}/x"], "dY": LAYER_ARRAYS[f"{name}/dy"]})
    np.testing.assert_allclose(values[0], LAYER_ARRAYS[f"{name}/y"], rtol=1e-5, atol=1e-5, err_msg=f"{name}: y")
    assert {f"{name}/grad/{key}" for key in wanted} == {key for key in LAYER_ARRAYS if key.startswith(f"{name}/grad/")}
    for (key, _), value in zip(wanted.items(), values[1:], strict=True):
        expected = LAYER_ARRAYS[f"{name}/grad/{key}"]
        got = value.reshape(expected.shape)  # PReLU's slope is exported as [1, C, 1]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=f"{name}: {key}")
