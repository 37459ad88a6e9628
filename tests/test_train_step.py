"""The train-step builder: its models, defaults and refusals (torch-free; parity is in test_train_step_parity.py).

Small models built with onnx.helper: a linear layer and an LSTM with a head, a model whose
weights are Constant nodes, a model whose branch is chosen by an input (If), a model with two
outputs and one with training-mode Dropout. The gradient and apply models must reproduce the
train step; the eval model must switch Dropout off; refusals must name what is wrong.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlstm.graphs import build_training_models, losses, optimizers
from ortlstm.graphs.prepare import prepare_model
from ortlstm.ops import session_options

OPSET = 17
IR_VERSION = 10
RECORDINGS = Path(__file__).parent / "recordings" / "train_step"


def _model(nodes, inputs, outputs, initializers, opset: int = OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)


def _linear_model(rng: np.random.Generator, with_constant_weight: bool = False) -> onnx.ModelProto:
    """Logits = x @ W^T + b, x [N, 3], 4 classes; W as a Constant node when asked."""
    weight = rng.standard_normal((4, 3)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["logits"], transB=1)]
    initializers = [numpy_helper.from_array(bias, "b")]
    if with_constant_weight:
        nodes.insert(0, helper.make_node("Constant", [], ["W"], value=numpy_helper.from_array(weight, "W")))
    else:
        initializers.append(numpy_helper.from_array(weight, "W"))
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])],
        initializers,
    )


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])


def _feeds(built, batch: dict[str, np.ndarray], params=None, state=None, lr: float = 0.1, step: int = 1) -> dict:
    signature = built.signature
    feeds = dict(batch)
    feeds.update(params if params is not None else built.initial_params)
    feeds.update(state if state is not None else built.initial_state)
    feeds[signature.lr] = np.asarray(lr, np.float64)
    feeds[signature.step] = np.asarray(step, np.int64)
    return feeds


def _batch(rng: np.random.Generator, n: int = 5) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((n, 3)).astype(np.float32), "target": rng.integers(0, 4, n).astype(np.int64)}


def test_split_models_equal_the_train_step(rng: np.random.Generator) -> None:
    built = build_training_models(_linear_model(rng), loss=losses.Loss.cross_entropy(), optimizer=optimizers.AdamW())
    signature = built.signature
    batch = _batch(rng)
    whole = dict(
        zip(
            [o.name for o in built.train_step.graph.output],
            _session(built.train_step).run(None, _feeds(built, batch)),
            strict=True,
        )
    )
    grads = dict(
        zip(
            [o.name for o in built.gradients.graph.output],
            _session(built.gradients).run(None, {**batch, **built.initial_params}),
            strict=True,
        )
    )
    apply_feeds = {**built.initial_params, **built.initial_state}
    apply_feeds.update({signature.grads[name]: grads[signature.grads[name]] for name in signature.params})
    apply_feeds[signature.lr] = np.asarray(0.1, np.float64)
    apply_feeds[signature.step] = np.asarray(1, np.int64)
    applied = dict(
        zip([o.name for o in built.apply.graph.output], _session(built.apply).run(None, apply_feeds), strict=True)
    )
    assert whole[signature.loss] == grads[signature.loss]
    for name, new in zip(signature.params, signature.new_params, strict=True):
        np.testing.assert_array_equal(whole[new], applied[new], err_msg=name)
        assert not np.array_equal(whole[new], built.initial_params[name]), f"{name} did not move"


def test_binary_cross_entropy_trains_with_torchs_backward(rng: np.random.Generator) -> None:
    """Probabilities from a Sigmoid, binary_cross_entropy, one SGD step, in float64.

    The gradient is torch's binary_cross_entropy_backward, (p - y) / max(p (1 - p), 1e-12), not
    the derivative of the clamped loss: one logit of -30 (p = 9.4e-14) takes the 1e-12 branch,
    where the true derivative of its term is 10x larger. Reference: numpy, from that formula and
    the probabilities the step computed.
    """
    weight = rng.standard_normal((1, 3))
    bias = np.asarray([0.1])
    model = _model(
        [helper.make_node("Gemm", ["x", "W", "b"], ["logit"], transB=1), helper.make_node("Sigmoid", ["logit"], ["p"])],
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 3])],
        [helper.make_tensor_value_info("p", TensorProto.DOUBLE, ["N", 1])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "b")],
    )
    built = build_training_models(
        model, loss=losses.Loss.binary_cross_entropy(), optimizer=optimizers.SGD(lr=0.5), extra_outputs=["p"]
    )
    x = rng.standard_normal((4, 3))
    x[0] = (-30.1 - bias[0]) * weight[0] / (weight[0] @ weight[0])  # logit -30.1
    y = np.asarray([[1.0], [0.0], [1.0], [0.3]])
    outputs = dict(
        zip(
            [o.name for o in built.train_step.graph.output],
            _session(built.train_step).run(None, _feeds(built, {"x": x, "target": y}, lr=0.5)),
            strict=True,
        )
    )
    p = outputs["p"]  # onnxruntime's Sigmoid, relatively inexact near 0: the formulas are under test
    assert p[0, 0] < 1e-12
    loss = np.mean((y - 1) * np.maximum(np.log1p(-p), -100) - y * np.maximum(np.log(p), -100))
    grad_p = (p - y) / np.maximum((1 - p) * p, float(np.float32(1e-12))) / p.size
    grad_logit = grad_p * p * (1 - p)
    np.testing.assert_allclose(outputs[built.signature.loss], loss, rtol=1e-12)
    expected = {"W": weight - 0.5 * grad_logit.T @ x, "b": bias - 0.5 * grad_logit.sum(axis=0)}
    for name, new in zip(built.signature.params, built.signature.new_params, strict=True):
        np.testing.assert_allclose(outputs[new], expected[name], rtol=1e-12, atol=1e-15, err_msg=name)


def test_kl_div_batchmean_distills_soft_labels(rng: np.random.Generator) -> None:
    """LogSoftmax outputs against a teacher's probabilities, kl_div "batchmean", one SGD step (float64).

    Reference: numpy. The loss is sum(xlogy(y, y) - y * log_p) / N; its gradient through the
    LogSoftmax is (softmax - y) / N when each row of y sums to 1.
    """
    weight, bias = rng.standard_normal((4, 3)), rng.standard_normal(4)
    model = _model(
        [
            helper.make_node("Gemm", ["x", "W", "b"], ["logits"], transB=1),
            helper.make_node("LogSoftmax", ["logits"], ["log_p"], axis=1),
        ],
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 3])],
        [helper.make_tensor_value_info("log_p", TensorProto.DOUBLE, ["N", 4])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "b")],
    )
    built = build_training_models(
        model, loss=losses.Loss.kl_div(reduction="batchmean"), optimizer=optimizers.SGD(lr=0.5)
    )
    x = rng.standard_normal((5, 3))
    teacher = rng.random((5, 4))
    teacher[0, 1] = 0.0  # xlogy(0, 0) = 0
    teacher /= teacher.sum(axis=1, keepdims=True)
    outputs = dict(
        zip(
            [o.name for o in built.train_step.graph.output],
            _session(built.train_step).run(None, _feeds(built, {"x": x, "target": teacher}, lr=0.5)),
            strict=True,
        )
    )
    logits = x @ weight.T + bias
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    entropy = np.where(teacher > 0, teacher * np.log(np.where(teacher > 0, teacher, 1.0)), 0.0)
    np.testing.assert_allclose(outputs[built.signature.loss], np.sum(entropy - teacher * log_p) / 5, rtol=1e-12)
    grad_logits = (np.exp(log_p) - teacher) / 5
    expected = {"W": weight - 0.5 * grad_logits.T @ x, "b": bias - 0.5 * grad_logits.sum(axis=0)}
    for name, new in zip(built.signature.params, built.signature.new_params, strict=True):
        np.testing.assert_allclose(outputs[new], expected[name], rtol=1e-12, atol=1e-15, err_msg=name)


def test_default_requires_grad_is_every_float_initializer_reaching_the_loss(rng: np.random.Generator) -> None:
    model = _linear_model(rng)
    unused = numpy_helper.from_array(np.ones(3, np.float32), "unused")
    model.graph.initializer.append(unused)
    built = build_training_models(model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.1))
    assert set(built.signature.params) == {"W", "b"}


def test_constant_node_weights_are_trainable(rng: np.random.Generator) -> None:
    built = build_training_models(
        _linear_model(rng, with_constant_weight=True),
        loss=losses.Loss.cross_entropy(),
        optimizer=optimizers.SGD(lr=0.1),
    )
    assert set(built.signature.params) == {"W", "b"}
    outputs = _session(built.train_step).run(None, _feeds(built, _batch(rng)))
    new_w = outputs[1 + list(built.signature.params).index("W")]
    assert not np.array_equal(new_w, built.initial_params["W"])


def test_fixed_input_chooses_the_if_branch(rng: np.random.Generator) -> None:
    """An If on an input (a sample rate, say) is replaced by the branch the fixed value picks."""
    weight = rng.standard_normal((4, 3)).astype(np.float32)
    then_branch = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W"], ["then_out"], transB=1)],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, None)],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W"], ["else_out"], transB=1, alpha=2.0)],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Equal", ["sr", "sr16k"], ["is16k"]),
        helper.make_node("If", ["is16k"], ["logits"], then_branch=then_branch, else_branch=else_branch),
    ]
    model = _model(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.asarray(16000, np.int64), "sr16k")],
    )
    with pytest.raises(ValueError, match=r"no gradient rule for ai\.onnx::If node .* fixed_inputs="):
        build_training_models(model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.1))
    for rate, alpha in ((16000, 1.0), (8000, 2.0)):
        built = build_training_models(
            model,
            loss=losses.Loss.cross_entropy(),
            optimizer=optimizers.SGD(lr=0.1),
            fixed_inputs={"sr": np.asarray(rate, np.int64)},
        )
        assert built.signature.batch_inputs == ("x",)
        assert not any(node.op_type == "If" for node in built.train_step.graph.node)
        batch = _batch(rng)
        (logits,) = _session(built.eval).run(["logits"], {**batch, **built.initial_params})
        np.testing.assert_allclose(logits, alpha * batch["x"] @ weight.T, rtol=1e-6)


def test_several_outputs_need_the_loss_output_named(rng: np.random.Generator) -> None:
    model = _linear_model(rng)
    model.graph.node.append(helper.make_node("Relu", ["logits"], ["state"]))
    model.graph.output.append(helper.make_tensor_value_info("state", TensorProto.FLOAT, None))
    with pytest.raises(ValueError, match=r"the model has 2 outputs \['logits', 'state'\]: name the one the loss reads"):
        build_training_models(model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.1))
    built = build_training_models(
        model,
        loss=losses.Loss.cross_entropy(),
        optimizer=optimizers.SGD(lr=0.1),
        output="logits",
        extra_outputs=["state"],
    )
    outputs = [o.name for o in built.train_step.graph.output]
    assert outputs[:2] == [built.signature.loss, "state"]


def test_wrongly_declared_output_shape_is_not_trusted(rng: np.random.Generator) -> None:
    model = _linear_model(rng)
    dims = model.graph.output[0].type.tensor_type.shape.dim
    dims[1].dim_value = 7  # the exporter's word: 7 classes; the Gemm computes 4
    built = build_training_models(model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.1))
    loss, *_ = _session(built.train_step).run(None, _feeds(built, _batch(rng)))
    assert np.isfinite(loss)
    # The prepared model declares what inference computes instead, so onnx.checker accepts it.
    prepared = prepare_model(model).model
    declared = prepared.graph.output[0].type.tensor_type.shape.dim
    assert [(dim.dim_param, dim.dim_value) for dim in declared] == [("N", 0), ("", 4)]
    onnx.checker.check_model(prepared, full_check=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"requires_grad": ["nope"]}, r"requires_grad: 'nope' matches no parameter of the model\. Its parameters are"),
        ({"requires_grad": []}, r"requires_grad is empty"),
        ({"output": "missing"}, r"output 'missing' is not an output of the model; its outputs are \['logits'\]"),
        ({"target": "x"}, r"target 'x': the model already has a value of that name"),
    ],
)
def test_refusals_name_what_is_wrong(rng: np.random.Generator, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_training_models(
            _linear_model(rng), loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.1), **kwargs
        )


def test_eval_model_switches_dropout_off(rng: np.random.Generator) -> None:
    model = _linear_model(rng)
    model.graph.node[0].output[0] = "pre"
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(0.5, np.float32), "ratio"))
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(True), "training"))
    model.graph.node.append(helper.make_node("Dropout", ["pre", "ratio", "training"], ["logits"]))
    built = build_training_models(model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.1))
    batch = _batch(rng, 64)
    (logits,) = _session(built.eval).run(["logits"], {**batch, **built.initial_params})
    expected = batch["x"] @ built.initial_params["W"].T + built.initial_params["b"]
    np.testing.assert_allclose(logits, expected, rtol=1e-6)
    losses_seen = {float(_session(built.train_step).run(None, _feeds(built, batch))[0]) for _ in range(3)}
    assert len(losses_seen) > 1, "training-mode Dropout should draw a new mask each step"


def test_unoptimized_dynamo_export_gives_a_train_step_of_similar_size() -> None:
    """Static integer shape arithmetic is folded: dynamo's optimize=False export is not many times larger.

    Measured with the optimizer in standard ops (about 20 nodes per parameter), as when the bound
    was set (871 vs 361 nodes; 1347 before the folding): the fused AdamUpdate (one node per
    parameter) makes both smaller, 371 vs 132, and the ratio a measure of the optimizer instead.
    Since the default stopped training the exporter's zero initial states (torch's parameters
    only), both are smaller again, 717 vs 275: the dynamo export lost a trained [2, 4, 7] state
    and its gradient chain, which had padded its count.
    """
    sizes = {}
    for exporter in ("dynamo", "dynamo_unoptimized"):
        with np.load(RECORDINGS / f"tokens_seq_first_y-{exporter}-AdamW.npz") as data:
            model = onnx.load_from_string(data["model"].tobytes())
        optimizer = optimizers.AdamW(implementation="onnx")
        built = build_training_models(model, loss=losses.Loss.cross_entropy(), optimizer=optimizer)
        sizes[exporter] = len(built.train_step.graph.node)
    assert sizes["dynamo_unoptimized"] < 2.75 * sizes["dynamo"], sizes


def test_models_load_in_the_runtime_asked_for(rng: np.random.Generator) -> None:
    built = build_training_models(_linear_model(rng), loss=losses.Loss.mse_loss(), optimizer=optimizers.Adam())
    for model in (built.train_step, built.eval, built.gradients, built.apply):
        assert model.ir_version == IR_VERSION
        onnx.checker.check_model(model, full_check=True)


def test_docs_list_every_op_with_a_gradient_rule() -> None:
    """docs/training.md's list of differentiable ops is the registry's."""
    from ortlstm.graphs.autodiff import registered_ops

    text = (Path(__file__).parent.parent / "docs" / "training.md").read_text()
    section = text.split("<!-- ops-with-rules", 1)[1].split("-->", 1)[1].split("<!-- /ops-with-rules -->", 1)[0]
    listed = {name.strip() for name in section.replace("\n", " ").split(",") if name.strip()}
    registered = {f"{domain}::{op_type}" if domain else op_type for domain, op_type in registered_ops()}
    assert listed == registered, (
        f"missing in docs: {sorted(registered - listed)}; not registered: {sorted(listed - registered)}"
    )
