"""ortlstm: LSTM training ops for ONNX Runtime.

Subpackages: ``ortlstm.ops`` (op contract, kernel library and session plumbing) and
``ortlstm.graphs`` (builders of ONNX graphs around the ops).
"""

from __future__ import annotations

__version__ = "0.1.0"
