"""Runs single ortlstm nodes in onnxruntime for the kernel tests.

Models are built through ``ortlstm.ops.make_node`` (ports ordered by the spec, never by hand) and
sessions are cached per (op, present ports, attributes, dtype), so a parametrized test pays for
session creation once.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import ortlstm.ops
from ortlstm.ops import schema

IR_VERSION = 10  # onnxruntime 1.19 loads IR <= 10
ONNX_OPSET = 17

_ELEM_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}
_INT32_PORTS = {"sequence_lens"}


def make_model(
    op_type: str,
    present_inputs: Sequence[str],
    present_outputs: Sequence[str],
    dtype: np.dtype | type,
    attributes: Mapping[str, object],
) -> onnx.ModelProto:
    """One ortlstm node whose graph inputs/outputs are named after the ports."""
    op = schema.op_by_name(op_type)
    elem = _ELEM_TYPES[np.dtype(dtype)]
    node = ortlstm.ops.make_node(
        op_type,
        {name: name for name in present_inputs},
        {name: name for name in present_outputs},
        name=f"{op_type}_under_test",
        **attributes,
    )
    graph_inputs = [
        helper.make_tensor_value_info(port.name, TensorProto.INT32 if port.name in _INT32_PORTS else elem, None)
        for port in op.inputs
        if port.name in present_inputs
    ]
    graph_outputs = [
        helper.make_tensor_value_info(port.name, elem, None) for port in op.outputs if port.name in present_outputs
    ]
    graph = helper.make_graph([node], op_type, graph_inputs, graph_outputs)
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION)],
        ir_version=IR_VERSION,
    )


@functools.lru_cache(maxsize=512)
def _cached_session(
    op_type: str, inputs: tuple[str, ...], outputs: tuple[str, ...], dtype: str, attrs: str, threads: int | None = None
) -> ort.InferenceSession:
    model = make_model(op_type, inputs, outputs, np.dtype(dtype), json.loads(attrs))
    extra = {} if threads is None else {"intra_op_num_threads": threads}
    options = ortlstm.ops.session_options(**extra)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def session(
    op_type: str,
    present_inputs: Sequence[str],
    present_outputs: Sequence[str],
    dtype: np.dtype | type,
    attributes: Mapping[str, object],
    threads: int | None = None,
) -> ort.InferenceSession:
    """A cached session running one ortlstm node (``threads``: its intra-op threads, else the default)."""
    return _cached_session(
        op_type,
        tuple(present_inputs),
        tuple(present_outputs),
        np.dtype(dtype).name,
        json.dumps(dict(attributes), sort_keys=True),
        threads,
    )


def run(
    op_type: str,
    inputs: Mapping[str, np.ndarray | None],
    attributes: Mapping[str, object],
    *,
    dtype: np.dtype | type = np.float64,
    outputs: Sequence[str] | None = None,
    threads: int | None = None,
) -> dict[str, np.ndarray]:
    """Runs one node; ``None`` inputs are omitted, float inputs are cast to ``dtype``.

    Args:
        op_type: ``"LSTMTraining"`` or ``"LSTMGrad"``.
        inputs: Port name -> array (or ``None`` for an absent optional input).
        attributes: Node attributes.
        dtype: float32 or float64.
        outputs: The ports to request (default: all).
        threads: The session's intra-op threads, where a test needs the time loop cut into tasks
            (default: ``ortlstm.ops.session_options()``'s).

    Returns:
        Port name -> array for the requested outputs.
    """
    op = schema.op_by_name(op_type)
    requested = list(outputs) if outputs is not None else list(schema.output_names(op))
    present = [port.name for port in op.inputs if inputs.get(port.name) is not None]
    feeds = {
        name: np.asarray(inputs[name]) if name in _INT32_PORTS else np.asarray(inputs[name], dtype=dtype)
        for name in present
    }
    sess = session(op_type, present, requested, dtype, attributes, threads)
    values = sess.run(requested, feeds)
    return dict(zip(requested, values, strict=True))
