"""Kept so that ``ortlstm.graphs.autodiff.rules_sequence`` still imports: it is a prepare rewrite.

``resolve_static_sequences`` rewrites reads of sequences into tensor ops before differentiation,
a step of ``prepare``'s pipeline, so it lives in ``ortlstm.graphs.prepare.sequences``; the
package's own modules import it from there (tests/test_layers.py fails on an import of this name).
"""

from __future__ import annotations

from ortlstm.graphs.prepare.sequences import SEQUENCE_OPS, resolve_static_sequences  # noqa: F401 - re-exported
