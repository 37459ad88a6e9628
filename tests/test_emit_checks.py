"""The emitter's schema check (graphs/emit/checks.py): every node is checked when it is made.

The oracle is onnx's own checker (``onnx.checker``'s C++ ``check_node``, a separate
implementation): for each node below, ours refuses it exactly when onnx's does, for ai.onnx ops
and for the ortlstm ops (registered with onnx by ``import ortlstm.ops``). Where onnx cannot tell
(com.microsoft, a user's domain), the node passes.
"""

from __future__ import annotations

from typing import Any

import onnx
import onnx.checker
import onnx.defs
import onnx.helper
import onnx.numpy_helper
import pytest

import ortlstm.ops  # noqa: F401 - registers the ortlstm schemas with onnx (the oracle's view of them)
from ortlstm.graphs.emit import GraphEmitter, NodeSchemaError, check_node, make_checked_node
from ortlstm.graphs.emit.checks import op_signature
from ortlstm.ops import schema

OPSET = 17


def onnx_refuses(node: onnx.NodeProto, opset: int = OPSET) -> bool:
    """Whether onnx's checker refuses the node (the oracle).

    onnx's checker passes a node of an op it does not know in a domain other than ai.onnx (a custom
    op); there the oracle is whether ``ortlstm.ops.schema`` declares the op.
    """
    if node.domain and not onnx.defs.has(node.op_type, node.domain):
        return node.op_type not in {spec.name for spec in schema.ALL_OPS}
    context = onnx.checker.C.CheckerContext()
    context.ir_version = 8
    context.opset_imports = {"": opset, schema.DOMAIN: schema.OPSET_VERSION}
    try:
        onnx.checker.C.check_node(node.SerializeToString(), context, onnx.checker.C.LexicalScopeContext())
    except onnx.checker.ValidationError:
        return True
    return False


def node(op_type: str, inputs: list[str], outputs: int = 1, domain: str = "", **attributes: Any) -> onnx.NodeProto:
    return onnx.helper.make_node(
        op_type, inputs, [f"y{k}" for k in range(outputs)], name=f"{op_type}_0", domain=domain, **attributes
    )


LSTM_GRAD_INPUTS = len(schema.input_names(schema.LSTM_GRAD))

# (node, the phrase our message must contain); None: the node fits.
CASES: dict[str, tuple[onnx.NodeProto, str | None]] = {
    "add": (node("Add", ["a", "b"]), None),
    "misspelt op": (node("Sofmax", ["a"]), "ai.onnx has no op 'Sofmax' at opset 17; did you mean 'Softmax'"),
    "op newer than the opset": (node("Gelu", ["a"]), "no op 'Gelu' at opset 17: it exists from opset 20"),
    "too few inputs": (node("Add", ["a"]), "has 1 input ['a']; it takes 2 (A, B)"),
    "too many inputs": (node("Relu", ["a", "b"]), "has 2 inputs ['a', 'b']; it takes 1 (X)"),
    "required input empty": (node("Add", ["a", ""]), "leaves input 1 (B) empty, which the op requires"),
    "optional input empty": (node("Clip", ["a", "", "hi"]), None),
    "too many outputs": (node("Relu", ["a"], outputs=2), "has 2 outputs ['y0', 'y1']; it takes 1 (Y)"),
    "variadic": (node("Sum", ["a", "b", "c"]), None),
    "variadic, none": (node("Concat", [], axis=0), "has 0 inputs []; it takes at least 1 (inputs)"),
    "unknown attribute": (node("Concat", ["a", "b"], axis=0, axes=0), "has attribute 'axes', which the op does not"),
    "missing attribute": (node("Concat", ["a", "b"]), "lacks the required attribute(s) ['axis']"),
    "attribute of another type": (node("LeakyRelu", ["x"], alpha=1), "'alpha' of type INT; the op's is FLOAT"),
    "attribute older than the opset": (node("ReduceSum", ["x"], axes=[0]), "has attribute 'axes'"),
    "ortlstm op": (node("SigmoidGrad", ["dy", "y"], domain=schema.DOMAIN), None),
    "misspelt ortlstm op": (
        node("SigmoidGrd", ["dy", "y"], domain=schema.DOMAIN),
        "ortlstm has no op 'SigmoidGrd' (ortlstm.ops.schema.ALL_OPS); did you mean 'SigmoidGrad'",
    ),
    "ortlstm op, too few inputs": (
        node("SigmoidGrad", ["dy"], domain=schema.DOMAIN),
        "has 1 input ['dy']; it takes 2",
    ),
    "ortlstm op, unknown attribute": (
        node("SigmoidGrad", ["dy", "y"], domain=schema.DOMAIN, alpha=1.0),
        "has attribute 'alpha', which the op does not have (its attributes: none)",
    ),
    "ortlstm op, required attribute missing": (
        node("LSTMGrad", ["x"] * LSTM_GRAD_INPUTS, domain=schema.DOMAIN),
        "lacks the required attribute(s) ['hidden_size']",
    ),
    "ortlstm op, attribute of another type": (
        node("LSTMGrad", ["x"] * LSTM_GRAD_INPUTS, domain=schema.DOMAIN, hidden_size=4.0),
        "'hidden_size' of type FLOAT; the op's is INT",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_agrees_with_onnx_checker(case: str) -> None:
    made, phrase = CASES[case]
    assert onnx_refuses(made) == (phrase is not None), "the case itself is wrong: onnx's checker disagrees"
    if phrase is None:
        check_node(made, OPSET)
        return
    with pytest.raises(NodeSchemaError) as raised:
        check_node(made, OPSET)
    assert f"node {made.name!r}" in str(raised.value)
    assert phrase in str(raised.value)


def test_the_emitter_checks_each_node_and_keeps_none_that_fails() -> None:
    emitter = GraphEmitter(OPSET)
    emitter.op("Relu", ["x"])
    with pytest.raises(NodeSchemaError, match=r"node 'Concat' \(ai.onnx Concat \(opset 17.*lacks the required"):
        emitter.op("Concat", ["a", "b"])
    assert [made.op_type for made in emitter.nodes] == ["Relu"]


def test_attribute_protos_count_before_the_check() -> None:
    """A gradient op takes its forward node's attributes as they are (the LSTM and CTC rules)."""
    emitter = GraphEmitter(OPSET)
    hidden = onnx.helper.make_attribute("hidden_size", 4)
    emitter.op("LSTMGrad", ["x"] * LSTM_GRAD_INPUTS, domain=schema.DOMAIN, attribute_protos=[hidden])
    assert emitter.nodes[-1].attribute == [hidden]
    with pytest.raises(NodeSchemaError, match="lacks the required attribute"):
        emitter.op("LSTMGrad", ["x"] * LSTM_GRAD_INPUTS, domain=schema.DOMAIN)


def test_domains_onnx_does_not_know_are_left_to_onnxruntime() -> None:
    emitter = GraphEmitter(OPSET)
    emitter.op("FusedMatMul", ["a", "b"], domain="com.microsoft", alpha=1.0)
    emitter.op("MyOwnOp", ["a"], domain="my.domain", anything=1)
    assert op_signature("com.microsoft", "FusedMatMul", OPSET) is None
    unknown = r"ai.onnx.ml has no op 'Normalizr' \(onnx.defs\); did you mean 'Normalizer'"
    with pytest.raises(NodeSchemaError, match=unknown):
        emitter.op("Normalizr", ["a"], domain="ai.onnx.ml")


@pytest.mark.parametrize("spec", schema.ALL_OPS, ids=lambda spec: spec.name)
def test_every_ortlstm_op_in_full_fits_both_schemas(spec: schema.OpSpec) -> None:
    """Every port named and every attribute at its declared type: ours and onnx's registration agree it fits."""
    values = {
        schema.AttrType.INT: 1,
        schema.AttrType.FLOAT: 1.0,
        schema.AttrType.STRING: "a",
        schema.AttrType.INTS: [1],
        schema.AttrType.FLOATS: [1.0],
        schema.AttrType.STRINGS: ["a"],
    }
    made = node(
        spec.name,
        [port.name for port in spec.inputs],
        outputs=len(spec.outputs),
        domain=spec.domain,
        **{attribute.name: values[attribute.type] for attribute in spec.attributes},
    )
    assert not onnx_refuses(made)
    check_node(made, OPSET)


def test_signatures_are_computed_once() -> None:
    op_signature.cache_clear()
    for _ in range(3):
        op_signature("", "MatMul", OPSET)
    assert op_signature.cache_info().misses == 1


def test_the_old_module_names_still_import() -> None:
    """Code outside the package may import the emitter, the plumbing and the sequence rewrite by their old names."""
    from ortlstm.graphs import graph_utils as old_graph_utils
    from ortlstm.graphs.autodiff import emitter as old_emitter
    from ortlstm.graphs.autodiff import rules_sequence as old_rules_sequence
    from ortlstm.graphs.emit import graph_utils
    from ortlstm.graphs.prepare import sequences

    assert old_emitter.GraphEmitter is GraphEmitter
    assert old_emitter.used_names is graph_utils.used_names
    assert old_graph_utils.prune_to_outputs is graph_utils.prune_to_outputs
    assert old_rules_sequence.resolve_static_sequences is sequences.resolve_static_sequences


def test_a_misspelt_op_in_a_gradient_rule_fails_at_the_first_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule's typo fails when the rule first runs, naming the node the rule made, not when onnxruntime loads it."""
    import numpy as np

    from ortlstm.graphs.autodiff import build_backward, infer_value_types, registry

    monkeypatch.setattr(registry, "_RULES", dict(registry._RULES))

    def misspelt(ctx: registry.GradientContext, grad_outputs: Any) -> list[str | None]:
        return [ctx.op("Mull", [grad_outputs[0], ctx.output(0)])]

    registry.register_gradient_rule("", "Relu", misspelt, replace=True)
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Relu", ["w"], ["r"], name="relu"),
            onnx.helper.make_node("ReduceSum", ["r"], ["loss"], keepdims=0),
        ],
        "g",
        [],
        [onnx.helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
        [onnx.numpy_helper.from_array(np.ones(3, np.float32), "w")],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    emitter = GraphEmitter(OPSET, ["w", "r", "loss", "relu"], infer_value_types(model))
    with pytest.raises(NodeSchemaError, match=r"node 'relu_grad/Mull': ai.onnx has no op 'Mull' at opset 17; did you "):
        build_backward(model.graph, "loss", ["w"], emitter)


def test_make_checked_node_refuses_a_misspelt_op_naming_the_node() -> None:
    """prepare's rewrites, the converters and the train step make nodes outside an emitter: checked all the same."""
    with pytest.raises(NodeSchemaError, match=r"node 'w/recomputed': ai.onnx has no op 'Transpse' .*'Transpose'"):
        make_checked_node(OPSET, "Transpse", ["w"], ["w_t"], name="w/recomputed", perm=[1, 0])
    with pytest.raises(NodeSchemaError, match=r"node 'lstm' \(ortlstm LSTMTraining\) has attribute 'hiden_size'"):
        make_checked_node(
            OPSET, "LSTMTraining", ["x", "w", "r"], ["y"], name="lstm", domain=schema.DOMAIN, hiden_size=4
        )


def test_make_checked_node_makes_what_onnx_helper_makes() -> None:
    made = make_checked_node(OPSET, "Concat", ["a", "b"], ["c"], name="cat", doc_string="why", axis=0, unused=None)
    assert made == onnx.helper.make_node("Concat", ["a", "b"], ["c"], name="cat", doc_string="why", axis=0)
    assert not onnx_refuses(made)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
def test_a_recurrent_node_with_every_onnx_attribute_converts(op_type: str) -> None:
    """The converters' training nodes are checked against ortlstm's spec: each attribute onnx's op has must pass."""
    from ortlstm.graphs.convert import convert
    from ortlstm.graphs.convert_gru import convert_recurrent

    values: dict[str, Any] = {
        "activation_alpha": [1.0],
        "activation_beta": [1.0],
        "activations": {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}[op_type],
        "clip": 5.0,
        "direction": "forward",
        "hidden_size": 2,
        "input_forget": 0,
        "layout": 0,
        "linear_before_reset": 1,
    }
    attributes = {name: values[name] for name in onnx.defs.get_schema(op_type, OPSET, "").attributes}
    node = onnx.helper.make_node(op_type, ["x", "w", "r"], ["y"], name="cell", **attributes)
    graph = onnx.helper.make_graph(
        [node],
        "g",
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in ("x", "w", "r")],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    converted = convert(model) if op_type == "LSTM" else convert_recurrent(model, op_type)
    (made,) = converted.graph.node
    assert made.domain == schema.DOMAIN
    assert set(attributes) | {"activations_csv"} == {attribute.name for attribute in made.attribute}
