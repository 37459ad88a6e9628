"""Builds ortlstm nodes from keyword arguments, ordered by the spec.

The one place that turns "these inputs, these outputs, these attributes" into an ``onnx.NodeProto``:
inputs are placed by their position in ``ops/schema.py``, absent optional inputs become ``""`` (or
are dropped when trailing), and ``activations`` is mirrored into ``activations_csv`` so the node runs
on every supported onnxruntime. Callers never spell out an input index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx
import onnx.helper

from ortlstm.ops import schema


def ordered_inputs(op: schema.OpSpec, inputs: Mapping[str, str | None]) -> list[str]:
    """Orders value names by the op's input list.

    Args:
        op: The op spec.
        inputs: Port name -> value name; ``None`` or ``""`` marks an absent optional input.

    Returns:
        The node's input list: ``""`` for absent optional inputs, trailing absent ones dropped.

    Raises:
        ValueError: An unknown port, or a required port without a value.
    """
    known = schema.input_names(op)
    unknown = sorted(set(inputs) - set(known))
    if unknown:
        raise ValueError(f"{op.name} has no input(s) {unknown}; its inputs are {list(known)}")
    names = [inputs.get(port.name) or "" for port in op.inputs]
    for port, name in zip(op.inputs, names, strict=True):
        if not name and not port.optional:
            raise ValueError(f"{op.name}: input {port.name} is required")
    while names and not names[-1]:
        names.pop()
    return names


def ordered_outputs(op: schema.OpSpec, outputs: Mapping[str, str | None] | Sequence[str]) -> list[str]:
    """Orders output value names like :func:`ordered_inputs`.

    Args:
        op: The op spec.
        outputs: Port name -> value name, or a full positional list; ``None``/``""`` omits a port
            (its kernel then skips computing it).

    Returns:
        The node's output list, trailing omitted outputs dropped.
    """
    if isinstance(outputs, Mapping):
        known = schema.output_names(op)
        unknown = sorted(set(outputs) - set(known))
        if unknown:
            raise ValueError(f"{op.name} has no output(s) {unknown}; its outputs are {list(known)}")
        names = [outputs.get(port.name) or "" for port in op.outputs]
    else:
        names = [name or "" for name in outputs]
        if len(names) > len(op.outputs):
            raise ValueError(f"{op.name} has {len(op.outputs)} outputs, got {len(names)} names")
    while names and not names[-1]:
        names.pop()
    return names


def lstm_attributes(**attributes: Any) -> dict[str, Any]:
    """Returns node attributes with ``activations`` mirrored into ``activations_csv``.

    onnxruntime before 1.25 cannot hand a string-list attribute to a custom kernel; the kernel
    reads the comma-separated copy there (docs/ops.md). ``None`` values are dropped.
    """
    result = {name: value for name, value in attributes.items() if value is not None}
    activations = result.get("activations")
    if activations is not None and "activations_csv" not in result:
        result["activations_csv"] = ",".join(str(name) for name in activations)
    return result


def make_node(
    op_type: str,
    inputs: Mapping[str, str | None],
    outputs: Mapping[str, str | None] | Sequence[str],
    *,
    name: str | None = None,
    **attributes: object,
) -> onnx.NodeProto:
    """Makes one ortlstm node.

    Args:
        op_type: ``"LSTMTraining"`` or ``"LSTMGrad"``.
        inputs: Port name (as in the spec) -> value name.
        outputs: Port name -> value name, or positional names.
        name: The node name (unique names let gradient builders pair nodes).
        **attributes: LSTM attributes (``hidden_size``, ``direction``, ``activations``, ...).

    Returns:
        The node, in domain ``ortlstm``.
    """
    op = schema.op_by_name(op_type)
    return onnx.helper.make_node(
        op.name,
        ordered_inputs(op, inputs),
        ordered_outputs(op, outputs),
        name=name,
        domain=op.domain,
        **lstm_attributes(**attributes),
    )
