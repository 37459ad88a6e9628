"""Kept so that ``ortlstm.graphs.graph_utils`` still imports: the plumbing lives in ``ortlstm.graphs.emit``.

The package's own modules import ``ortlstm.graphs.emit.graph_utils`` (tests/test_layers.py fails
on an import of this name); code outside the package may go on importing it from here.
"""

from __future__ import annotations

from ortlstm.graphs.emit.graph_utils import (  # noqa: F401 - the old names, re-exported
    defined_names,
    drop_unread_initializers,
    named_subgraphs,
    outer_reads,
    prune_to_outputs,
    reads_in_subgraphs,
    rename_values,
    subgraph_reads,
    subgraphs,
    unique_name,
    used_names,
    walk_graphs,
)
