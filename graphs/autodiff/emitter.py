"""Kept so that ``ortlstm.graphs.autodiff.emitter`` still imports: the emitter lives in ``ortlstm.graphs.emit``.

The package's own modules import ``ortlstm.graphs.emit.emitter`` (tests/test_layers.py fails on
an import of this name); code outside the package may go on importing it from here.
"""

from __future__ import annotations

from ortlstm.graphs.emit.emitter import (  # noqa: F401 - the old names, re-exported
    FLOAT_TYPES,
    MIN_OPSET,
    GraphEmitter,
    ValueType,
    infer_value_types,
    make_model,
    onnx_opset,
    unique_name,
    used_names,
    value_type_of,
)
