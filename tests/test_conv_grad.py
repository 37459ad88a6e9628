"""The ortlstm ConvGrad kernel against a NumPy reference, float32 and float64, and its refusals.

The reference (``reference_conv_grad``) differentiates the Conv by its definition, one kernel tap at
a time over the padded input: ``dW[m, c, k] = sum_{n, o} dY[n, m, o] X_pad[n, c, o*s + k*d]``, the same
products scattered back for dX, ``dB = sum(dY)``; it shares nothing with the kernel's im2col and
GEMMs. Finite differences of the rule that emits ConvGrad are in tests/test_autodiff_conv_rules.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import op_runner
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument, RuntimeException

import ortlstm.ops

_PREFIX = "ConvGrad node 'ConvGrad_under_test': "
_RTOL = {np.float64: 1e-12, np.float32: 2e-5}
"""Relative to the largest reference value of each output."""


def _resolved_pads(x_shape, w_shape, attributes) -> tuple[list[int], list[int]]:
    """Begin and end pads per spatial axis, SAME/VALID resolved as ONNX defines them."""
    spatial, kernel = x_shape[2:], w_shape[2:]
    r = len(kernel)
    strides = attributes.get("strides", [1] * r)
    dilations = attributes.get("dilations", [1] * r)
    mode = attributes.get("auto_pad", "NOTSET")
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            begin = total // 2 if mode == "SAME_UPPER" else total - total // 2
            begins.append(begin)
            ends.append(total - begin)
        return begins, ends
    pads = attributes.get("pads", [0] * (2 * r)) if mode == "NOTSET" else [0] * (2 * r)
    return list(pads[:r]), list(pads[r:])


def output_shape(x_shape, w_shape, attributes) -> tuple[int, ...]:
    """Y's shape: [N, M, out...]."""
    r = len(w_shape) - 2
    strides = attributes.get("strides", [1] * r)
    dilations = attributes.get("dilations", [1] * r)
    begins, ends = _resolved_pads(x_shape, w_shape, attributes)
    out = [
        (x_shape[2 + i] + begins[i] + ends[i] - (w_shape[2 + i] - 1) * dilations[i] - 1) // strides[i] + 1
        for i in range(r)
    ]
    return (x_shape[0], w_shape[0], *out)


def reference_conv_grad(dy: np.ndarray, x: np.ndarray, w: np.ndarray, attributes: dict) -> dict[str, np.ndarray]:
    """dX, dW, dB of ``Y = conv(X, W) + B`` by the definition, in float64."""
    dy, x, w = (np.asarray(v, dtype=np.float64) for v in (dy, x, w))
    r = x.ndim - 2
    strides = attributes.get("strides", [1] * r)
    dilations = attributes.get("dilations", [1] * r)
    group = attributes.get("group", 1)
    begins, ends = _resolved_pads(x.shape, w.shape, attributes)
    padded = np.pad(x, [(0, 0), (0, 0), *zip(begins, ends, strict=True)])
    grad_padded = np.zeros_like(padded)
    grad_w = np.zeros_like(w)
    out = dy.shape[2:]
    channels, maps = x.shape[1] // group, w.shape[0] // group
    for g in range(group):
        cs, ms = slice(g * channels, (g + 1) * channels), slice(g * maps, (g + 1) * maps)
        for k in np.ndindex(*w.shape[2:]):
            window = tuple(
                slice(k[i] * dilations[i], k[i] * dilations[i] + (out[i] - 1) * strides[i] + 1, strides[i])
                for i in range(r)
            )
            patch = padded[(slice(None), cs, *window)]  # [N, Cg, out...]
            n = x.shape[0]
            grad_w[(ms, slice(None), *k)] += np.einsum(
                "nmo,nco->mc", dy[:, ms].reshape(n, maps, -1), patch.reshape(n, channels, -1)
            )
            grad_padded[(slice(None), cs, *window)] += np.einsum("nm...,mc->nc...", dy[:, ms], w[(ms, slice(None), *k)])
    crop = tuple(slice(begins[i], begins[i] + x.shape[2 + i]) for i in range(r))
    return {
        "dX": grad_padded[(slice(None), slice(None), *crop)],
        "dW": grad_w,
        "dB": dy.sum(axis=(0, *range(2, dy.ndim))),
    }


@dataclasses.dataclass(frozen=True)
class Row:
    """One ConvGrad call: X's and W's shapes and the attributes."""

    id: str
    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    attributes: dict = dataclasses.field(default_factory=dict)

    def inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """dY, X and W, standard normal."""
        rng = np.random.default_rng(seed)
        y_shape = output_shape(self.x_shape, self.w_shape, self.attributes)
        return {
            "dY": rng.standard_normal(y_shape),
            "X": rng.standard_normal(self.x_shape),
            "W": rng.standard_normal(self.w_shape),
        }


ROWS = [
    Row("1d", (2, 3, 7), (4, 3, 3)),
    Row("1d_stride2_pads", (3, 3, 8), (4, 3, 3), {"strides": [2], "pads": [1, 2]}),
    Row("1d_stride_beyond_kernel", (2, 2, 11), (3, 2, 2), {"strides": [4]}),
    Row("1d_dilation3", (2, 2, 12), (3, 2, 3), {"dilations": [3], "pads": [2, 0]}),
    Row("2d_convlstm_cell", (5, 6, 9, 8), (12, 6, 3, 3), {"pads": [1, 1, 1, 1]}),
    Row("2d_batch1", (1, 4, 6, 5), (3, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    Row(
        "2d_strides_dilations_asym_pads",
        (2, 3, 9, 7),
        (4, 3, 2, 3),
        {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 0, 2]},
    ),
    Row("2d_group2", (3, 4, 6, 6), (6, 2, 3, 3), {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    Row("2d_depthwise", (2, 5, 7, 6), (5, 1, 3, 3), {"group": 5, "pads": [1, 1, 1, 1]}),
    Row("2d_depthwise_multiplier2", (2, 3, 6, 6), (6, 1, 3, 3), {"group": 3, "strides": [2, 1], "pads": [1, 1, 1, 1]}),
    Row("2d_same_upper_stride2", (2, 3, 7, 6), (4, 3, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    Row("2d_same_lower_stride3", (1, 2, 8, 7), (3, 2, 2, 3), {"auto_pad": "SAME_LOWER", "strides": [3, 2]}),
    Row("2d_valid_kernel_shape", (2, 3, 6, 5), (2, 3, 3, 2), {"auto_pad": "VALID", "kernel_shape": [3, 2]}),
    Row("2d_kernel1x1", (2, 5, 4, 3), (7, 5, 1, 1)),
    Row("3d_strides_pads", (2, 2, 4, 5, 6), (3, 2, 2, 3, 2), {"strides": [1, 2, 2], "pads": [1, 0, 1, 0, 1, 1]}),
    Row("3d_group2_dilations", (1, 4, 5, 6, 5), (2, 2, 2, 2, 2), {"group": 2, "dilations": [2, 1, 2]}),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.id)
def test_conv_grad_matches_the_numpy_reference(row: Row, dtype: type) -> None:
    inputs = row.inputs()
    expected = reference_conv_grad(inputs["dY"], inputs["X"], inputs["W"], row.attributes)
    got = op_runner.run("ConvGrad", inputs, row.attributes, dtype=dtype)
    for name, value in expected.items():
        assert got[name].dtype == dtype, f"{row.id}: {name}"
        assert got[name].shape == value.shape, f"{row.id}: {name}"
        scale = max(float(np.max(np.abs(value))), 1.0)
        np.testing.assert_allclose(got[name], value, rtol=0, atol=_RTOL[dtype] * scale, err_msg=f"{row.id}: {name}")


@pytest.mark.parametrize("wanted", [("dX",), ("dW",), ("dB",), ("dX", "dB"), ("dW", "dB")], ids="+".join)
def test_omitted_outputs_leave_the_others_unchanged(wanted: tuple[str, ...]) -> None:
    row = ROWS[7]  # 2d_group2
    inputs = row.inputs(seed=3)
    full = op_runner.run("ConvGrad", inputs, row.attributes)
    got = op_runner.run("ConvGrad", inputs, row.attributes, outputs=wanted)
    for name in wanted:
        np.testing.assert_array_equal(got[name], full[name], err_msg=name)


def test_empty_batch_gives_zero_weight_and_bias_gradients() -> None:
    row = Row("empty", (0, 3, 5, 5), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]})
    got = op_runner.run("ConvGrad", row.inputs(), row.attributes)
    assert got["dX"].shape == (0, 3, 5, 5)
    np.testing.assert_array_equal(got["dW"], np.zeros((4, 3, 3, 3)))
    np.testing.assert_array_equal(got["dB"], np.zeros(4))


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_results_do_not_depend_on_the_thread_count(dtype: type) -> None:
    """The images are split into parts by the machine, not the pool: 1 and 2 threads agree bit for bit."""
    row = ROWS[4]  # 2d_convlstm_cell, 5 images
    model = op_runner.make_model("ConvGrad", ["dY", "X", "W"], ["dX", "dW", "dB"], dtype, row.attributes)
    feeds = {name: value.astype(dtype) for name, value in row.inputs(seed=5).items()}
    results = []
    for threads in (1, 2):
        options = ortlstm.ops.session_options(intra_op_num_threads=threads)
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        results.append(session.run(None, feeds))
    for name, one, two in zip(("dX", "dW", "dB"), *results, strict=True):
        np.testing.assert_array_equal(one, two, err_msg=name)


def test_shape_inference_gives_dx_dw_db_their_shapes() -> None:
    row = ROWS[7]
    model = op_runner.make_model("ConvGrad", ["dY", "X", "W"], ["dX", "dW", "dB"], np.float32, row.attributes)
    for port, shape in zip(("dY", "X", "W"), ((3, 6, 3, 3), row.x_shape, row.w_shape), strict=True):
        value = next(value for value in model.graph.input if value.name == port)
        value.CopyFrom(onnx.helper.make_tensor_value_info(port, onnx.TensorProto.FLOAT, shape))
    del model.graph.output[:]
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {
        value.name: tuple(dim.dim_value for dim in value.type.tensor_type.shape.dim)
        for value in inferred.graph.value_info
    }
    assert shapes == {"dX": row.x_shape, "dW": row.w_shape, "dB": (6,)}


_GOOD = Row("good", (2, 3, 6, 5), (4, 3, 3, 2), {"pads": [1, 0, 1, 1], "strides": [2, 1]})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"W": np.zeros((4, 2, 3, 2))},
            "W: expected shape [M, C/group=3, k...] for X with C=3 channels and group=1, got [4, 2, 3, 2]",
        ),
        (
            {"dY": np.zeros((2, 4, 2, 5))},
            "dY: expected shape [2, 4, 3, 5] ([N, M, out...], the forward Conv's output for X [2, 3, 6, 5] and "
            "W [4, 3, 3, 2] with these attributes), got [2, 4, 2, 5]",
        ),
        ({"dY": np.zeros((3, 4, 3, 5))}, "dY: expected shape [2, 4, 3, 5]"),
        (
            {"X": np.zeros((2, 3))},
            "X: expected rank >= 3 [N, C, in...] (batch, channels, at least one spatial axis), got shape [2, 3]",
        ),
        ({"W": np.zeros((4, 3, 3))}, "W: expected rank 4 [M, C/group, k...] (X's rank), got shape [4, 3, 3]"),
        ({"attributes": {"group": 2}}, "X: C=3 channels are not divisible by group=2; pass the forward Conv's group"),
        (
            {"attributes": {"group": 3}, "W": np.zeros((4, 1, 3, 2))},
            "W: M=4 maps (its first axis) are not divisible by group=3",
        ),
        (
            {"attributes": {"kernel_shape": [3, 3]}},
            "attribute kernel_shape: expected W's spatial dims [3, 2], got [3, 3]",
        ),
        (
            {"attributes": {"strides": [2]}},
            "attribute strides: expected 2 integers (one per spatial axis of X [2, 3, 6, 5]), got 1: [2]",
        ),
        (
            {"attributes": {"pads": [1, 1]}},
            "attribute pads: expected 4 integers (begin then end pads of each spatial axis",
        ),
        (
            {"X": np.zeros((2, 3, 1, 5)), "attributes": {}},
            "X: spatial axis 0 of size 1, padded to 1, is smaller than the dilated kernel's extent 3",
        ),
    ],
    ids=[
        "w_channels",
        "dy_spatial",
        "dy_batch",
        "x_rank",
        "w_rank",
        "group_channels",
        "group_maps",
        "kernel_shape",
        "strides_length",
        "pads_length",
        "too_small",
    ],
)
def test_bad_inputs_are_refused_naming_the_input(change: dict, message: str) -> None:
    inputs = {**_GOOD.inputs(), **{k: v for k, v in change.items() if k != "attributes"}}
    attributes = change.get("attributes", _GOOD.attributes)
    with pytest.raises(InvalidArgument) as error:
        op_runner.run("ConvGrad", inputs, attributes)
    assert _PREFIX + message in str(error.value)


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"auto_pad": "SAME"}, "attribute auto_pad: expected NOTSET, VALID, SAME_UPPER or SAME_LOWER, got 'SAME'"),
        ({"auto_pad": "SAME_UPPER", "pads": [1, 1, 1, 1]}, "attribute pads: given together with auto_pad=SAME_UPPER"),
        ({"group": 0}, "attribute group: expected an integer >= 1, got 0"),
        ({"strides": [0, 1]}, "attribute strides: expected integers >= 1, got [0, 1]"),
        ({"dilations": [1, -1]}, "attribute dilations: expected integers >= 1, got [1, -1]"),
        ({"pads": [0, -1, 0, 0]}, "attribute pads: expected integers >= 0, got [0, -1, 0, 0]"),
        ({"strides": 2}, "attribute strides: expected INTS, got INT"),
        ({"auto_pad": 1}, "attribute auto_pad: expected STRING, got INT"),
    ],
    ids=[
        "auto_pad_value",
        "pads_with_same",
        "group_0",
        "strides_0",
        "dilations_negative",
        "pads_negative",
        "strides_int",
        "auto_pad_int",
    ],
)
def test_bad_attributes_are_refused_at_session_creation(attributes: dict, message: str) -> None:
    with pytest.raises(RuntimeException) as error:
        op_runner.session("ConvGrad", ["dY", "X", "W"], ["dX", "dW", "dB"], np.float64, attributes)
    assert _PREFIX + message in str(error.value)


def _conv_classifier() -> onnx.ModelProto:
    """x [N, 2, 6, 6] -> Conv (3x3, 4 channels) -> Sigmoid -> GlobalAveragePool -> Flatten -> logits [N, 4]."""
    rng = np.random.default_rng(3)
    w = onnx.numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
        onnx.helper.make_node("Sigmoid", ["conv"], ["act"]),
        onnx.helper.make_node("GlobalAveragePool", ["act"], ["pooled"]),
        onnx.helper.make_node("Flatten", ["pooled"], ["logits"]),
    ]
    graph = onnx.helper.make_graph(
        nodes,
        "conv_classifier",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 2, 6, 6])],
        [onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["N", 4])],
        [w, b],
    )
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize(
    ("optimizer", "kernel_gradients", "expected"),
    [
        ("rmsprop", None, False),  # needs no library otherwise: stays runnable without it
        ("adam", None, True),  # the fused AdamUpdate loads the library anyway
        ("rmsprop", True, True),  # the Trainer's choice
        ("adam", False, False),
    ],
)
def test_train_steps_use_the_kernel_gradients_only_where_the_library_is_loaded_anyway(
    optimizer: str, kernel_gradients: bool | None, expected: bool
) -> None:
    from ortlstm.graphs import build_training_models, losses, optimizers

    chosen = {"rmsprop": optimizers.RMSprop(lr=0.01), "adam": optimizers.Adam(lr=0.01)}[optimizer]
    built = build_training_models(
        _conv_classifier(), loss=losses.Loss.cross_entropy(), optimizer=chosen, kernel_gradients=kernel_gradients
    )
    domains = {node.domain for node in built.train_step.graph.node}
    op_types = {node.op_type for node in built.train_step.graph.node}
    assert ({"ConvGrad", "SigmoidGrad"} <= op_types) == expected, op_types
    if optimizer == "rmsprop" and not expected:
        assert ortlstm.ops.DOMAIN not in domains
        # Runs in onnxruntime without the ortlstm library.
        session = ort.InferenceSession(built.train_step.SerializeToString(), providers=["CPUExecutionProvider"])
        assert session.get_inputs()


def test_the_trainer_uses_the_kernel_gradients_with_any_optimizer() -> None:
    from ortlstm.graphs import losses, optimizers
    from ortlstm.training import Trainer

    trainer = Trainer(_conv_classifier(), loss=losses.Loss.cross_entropy(), optimizer=optimizers.RMSprop(lr=0.01))
    op_types = {node.op_type for node in trainer._models["train_step"].graph.node}
    assert {"ConvGrad", "SigmoidGrad"} <= op_types
    x = np.random.default_rng(0).standard_normal((3, 2, 6, 6)).astype(np.float32)
    assert np.isfinite(trainer.step(x, target=np.array([0, 1, 3])))
