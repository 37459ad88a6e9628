"""The ortlstm op contract and its ONNX Runtime plumbing.

- ``schema``: each op declared once (ports, attributes, docs); everything else derives from it.
- ``library_path()`` / ``session_options()``: the built kernel library and ORT session options
  that load it; ``blas_backend()``: the GEMM backend it uses in this process;
  ``bf16_gemm_backend()``: that of its bfloat16 GEMMs.
- ``make_node``: an ortlstm node from keyword arguments, ordered by the spec.
- ``opset()``: an onnxscript ``Opset`` for the domain.

Importing this package registers the ops with onnx (``onnx.checker``, shape inference).
"""

from __future__ import annotations

from ortlstm.ops import schema
from ortlstm.ops.library import LIBRARY_FILENAME, bf16_gemm_backend, blas_backend, library_path, session_options
from ortlstm.ops.nodes import lstm_attributes, make_node
from ortlstm.ops.onnx_defs import opset, register_onnx_schemas

DOMAIN = schema.DOMAIN
OPSET_VERSION = schema.OPSET_VERSION

register_onnx_schemas()

__all__ = [
    "DOMAIN",
    "LIBRARY_FILENAME",
    "OPSET_VERSION",
    "bf16_gemm_backend",
    "blas_backend",
    "library_path",
    "lstm_attributes",
    "make_node",
    "opset",
    "register_onnx_schemas",
    "schema",
    "session_options",
]
