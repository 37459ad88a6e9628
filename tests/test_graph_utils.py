"""The shared graph plumbing (graphs/emit/graph_utils.py) on small hand-written graphs with subgraphs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlstm.graphs.autodiff import GraphEmitter, build_backward, infer_value_types
from ortlstm.graphs.emit.graph_utils import (
    defined_names,
    drop_unread_initializers,
    named_subgraphs,
    outer_reads,
    prune_to_outputs,
    rename_values,
    subgraph_reads,
    subgraphs,
    unique_name,
    used_names,
    walk_graphs,
)


def _value(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])


def _branch(name: str, nodes: list[onnx.NodeProto], output: str) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [_value(output)])


def _if_graph() -> onnx.GraphProto:
    """``y = If(c, then: a + shadow where shadow is defined inside, else: b as is)``; ``dead`` unused.

    The then-branch defines ``shadow``, which the main graph also computes: a read of it inside
    the branch is the branch's own value. A nested If in the then-branch reads ``d``.
    """
    nested = helper.make_node(
        "If",
        ["c"],
        ["n"],
        then_branch=_branch("nested_then", [helper.make_node("Neg", ["d"], ["nt"])], "nt"),
        else_branch=_branch("nested_else", [helper.make_node("Abs", ["d"], ["ne"])], "ne"),
    )
    then_branch = _branch(
        "then",
        [helper.make_node("Neg", ["a"], ["shadow"]), nested, helper.make_node("Add", ["shadow", "n"], ["t"])],
        "t",
    )
    else_branch = _branch("else", [], "b")  # returns the outer value b as is
    return helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"]),
            helper.make_node("Sigmoid", ["x"], ["b"]),
            helper.make_node("Tanh", ["x"], ["d"]),
            helper.make_node("Exp", ["x"], ["shadow"]),
            helper.make_node("Log", ["x"], ["dead"]),
            helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch),
        ],
        "main",
        [_value("x"), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [_value("y")],
        [helper.make_tensor("unused", TensorProto.FLOAT, [1], [0.0])],
    )


def test_subgraph_reads_are_outer_names_only_with_outputs_and_nested_reads() -> None:
    node = _if_graph().node[-1]
    assert [graph.name for graph in subgraphs(node)] == ["else", "then"]  # make_node sorts attributes
    # else: b (its output); then: a (Neg), c and d (nested If), not shadow (defined in the branch).
    assert subgraph_reads(node) == ["b", "a", "c", "d"]
    assert outer_reads(subgraphs(node)[0]) == ["b"]


def test_prune_keeps_what_subgraphs_read_and_drops_the_rest() -> None:
    graph = _if_graph()
    needed = prune_to_outputs(graph)
    assert [node.output[0] for node in graph.node] == ["a", "b", "d", "y"]  # shadow and dead dropped
    assert {"a", "b", "c", "d", "y"} <= needed
    assert "shadow" not in needed
    assert list(graph.initializer) == []
    assert [value.name for value in graph.input] == ["x", "c"]


def test_prune_to_chosen_outputs_drops_unread_inputs_when_asked() -> None:
    graph = _if_graph()
    prune_to_outputs(graph, ["b"], initializers=False, inputs=True)
    assert [node.output[0] for node in graph.node] == ["b"]
    assert [value.name for value in graph.input] == ["x"]
    assert [init.name for init in graph.initializer] == ["unused"]


def test_names_cover_every_subgraph() -> None:
    graph = _if_graph()
    assert [inner.name for inner in walk_graphs(graph)] == ["main", "else", "then", "nested_else", "nested_then"]
    assert {"nt", "ne", "t", "shadow", "unused"} <= used_names(graph)
    assert defined_names(graph.node[-1:]) == {"y", "shadow", "n", "nt", "ne", "t"}


def test_unique_name_counts_up_from_the_base() -> None:
    taken = {"w", "w_1", "v_inlined"}
    assert unique_name("w", taken) == "w_2"
    assert unique_name("x", taken) == "x"
    assert unique_name("v_inlined", taken, separator="") == "v_inlined1"
    assert unique_name("", taken) == "_1"
    assert {"w_2", "x", "v_inlined1", "_1"} <= taken


def test_rename_values_reaches_nested_subgraphs() -> None:
    graph = _if_graph()
    rename_values(graph, {"d": "d2", "unused": "u"})
    nested = next(inner for inner in walk_graphs(graph) if inner.name == "nested_then")
    assert list(nested.node[0].input) == ["d2"]
    assert graph.node[2].output[0] == "d2"
    assert graph.initializer[0].name == "u"


def test_named_subgraphs_label_each_graph_of_a_list() -> None:
    bodies = [_branch(f"b{k}", [], "x") for k in range(2)]
    node = helper.make_node("Custom", [], ["y"], domain="test")
    node.attribute.append(helper.make_attribute("bodies", bodies))
    node.attribute.append(helper.make_attribute("body", _branch("b", [], "x")))
    assert [(label, graph.name) for label, graph in named_subgraphs(node)] == [
        ("bodies[0]", "b0"),
        ("bodies[1]", "b1"),
        ("body", "b"),
    ]


def test_backward_sees_a_parameter_a_branch_returns_as_is() -> None:
    """An If branch that outputs the parameter itself reads it: no rule for If, so a clear refusal.

    Before the shared outer reads counted a subgraph's outputs, the parameter looked unreachable.
    """
    nodes = [
        helper.make_node(
            "If", ["c"], ["y"], then_branch=_branch("then", [], "w"), else_branch=_branch("else", [], "w")
        ),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "main",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.ones(2, np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    emitter = GraphEmitter(17, used_names(graph), infer_value_types(model))
    with pytest.raises(ValueError, match=r"no gradient rule for .*If.*1 parameter\(s\) \['w'\]"):
        build_backward(graph, "loss", ["w"], emitter)


def test_drop_unread_initializers_keeps_nodes_and_what_subgraphs_read() -> None:
    graph = _if_graph()
    graph.initializer.append(helper.make_tensor("a", TensorProto.FLOAT, [2], [1.0, 2.0]))  # read by a branch
    drop_unread_initializers(graph)
    assert [init.name for init in graph.initializer] == ["a"]
    assert len(graph.node) == 6  # dead nodes stay
