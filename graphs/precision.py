"""Training precision (issue 33): Lightning's names, and the ``matmul_precision`` the kernel ops get from them.

``"32-true"`` is float32 throughout. ``"bf16-mixed"`` is what ``torch.autocast("cpu", dtype=torch.bfloat16)``
does for the GEMMs: the training models' kernel ops that multiply matrices (LSTM, GRU, RNN and ConvGrad) carry
``matmul_precision="bfloat16"``, so their GEMMs take bfloat16-rounded operands and accumulate in float32,
while parameters, optimizer state, every other op and the exported model stay float32. Only the
training models change: the export writes the original model, which never had the attribute.
"""

from __future__ import annotations

import onnx

from ortlstm.graphs.emit.graph_utils import walk_graphs
from ortlstm.ops.contract import DOMAIN
from ortlstm.ops.schema import ALL_OPS

PRECISIONS: dict[str, str] = {"32-true": "float32", "bf16-mixed": "bfloat16"}
"""Lightning's precision name -> the kernel ops' ``matmul_precision``."""

GEMM_OPS: tuple[str, ...] = tuple(
    op.name for op in ALL_OPS if any(attribute.name == "matmul_precision" for attribute in op.attributes)
)
"""The kernel ops with a ``matmul_precision`` attribute, read off the schema (ops/spec_lstm.py MATMUL_PRECISION)."""


def matmul_precision(precision: object) -> str:
    """The ``matmul_precision`` of a precision name.

    Raises:
        ValueError: Not one of ``PRECISIONS`` (the message lists them and what each means).
    """
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(
            f"precision must be '32-true' (float32, the default) or 'bf16-mixed' (bfloat16 GEMMs with float32 "
            f"accumulation, weights and optimizer state, as torch.autocast on the CPU), got {precision!r}"
        )
    return PRECISIONS[precision]


def set_matmul_precision(model: onnx.ModelProto, precision: str) -> onnx.ModelProto:
    """Sets ``matmul_precision`` on every GEMM kernel op of ``model`` (subgraphs too), in place; returns it.

    ``"32-true"`` leaves the model as it is (the attribute's default is float32), so float32 models
    stay byte for byte what they were.
    """
    value = matmul_precision(precision)
    if value == "float32":
        return model
    for node in (node for graph in walk_graphs(model.graph) for node in graph.node):
        if node.domain == DOMAIN and node.op_type in GEMM_OPS:
            kept = [attribute for attribute in node.attribute if attribute.name != "matmul_precision"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("matmul_precision", value)])
    return model
