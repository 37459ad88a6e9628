"""``prepare_model``: the named rewrites of ``REWRITES``, in order, on one ``Preparation``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx

from ortlstm.graphs.prepare import dequantize, fixed_dims, folding, rewrites, torch_folds
from ortlstm.graphs.prepare.advice import ControlFlowAdvice
from ortlstm.graphs.prepare.state import Preparation, PreparedModel

Rewrite = Callable[[Preparation], None]

REWRITES: tuple[Rewrite, ...] = (
    rewrites.convert_old_opset,
    dequantize.dequantize_int8,
    rewrites.make_dynamic_dims_symbolic,
    rewrites.fix_inputs,
    rewrites.drop_declared_shapes,
    fixed_dims.free_export_dims,
    rewrites.choose_candidates,
    torch_folds.untie_merged_parameters,
    torch_folds.rebuild_folded_parameters,
    torch_folds.read_padding_rows,
    torch_folds.warn_fused_batchnorms,
    folding.fold_constants,
    rewrites.resolve_sequences,
    rewrites.drop_dead_values,
    rewrites.convert_lstms,
    rewrites.convert_grus,
    rewrites.convert_rnns,
    rewrites.drop_pow_exponents,
    rewrites.untie_running_statistics,
    rewrites.declare_output_shapes,
)
"""The rewrites of ``prepare_model``, in order (the package docstring says what each does)."""

DECIDING_REWRITES = REWRITES[: REWRITES.index(folding.fold_constants) + 1]
"""The rewrites that decide which ``If`` nodes are replaced (what a probe of the advice runs)."""


def prepare_model(
    model: onnx.ModelProto,
    fixed_inputs: Mapping[str, np.ndarray] | None = None,
    fixed_shapes: Mapping[str, Sequence[int | str | None]] | None = None,
    keep: Iterable[str] = (),
) -> PreparedModel:
    """Returns the model made ready for differentiation (see the package docstring).

    Args:
        model: The model as exported.
        fixed_inputs: Graph inputs whose values the user fixes for training (e.g. a sample rate
            that chooses an ``If`` branch); they become initializers.
        fixed_shapes: Graph input shapes the user fixes for training, one entry per axis: an int
            fixes that dim, None keeps the declared one (e.g. ``{"input": [None, 576]}`` fixes
            the sample count and keeps the batch dynamic). ``If`` conditions computed from those
            dims then fold; the prepared model accepts only inputs of these shapes.
        keep: Initializers to keep as candidates whatever the defaults say (the parameters a
            caller names to train, a 0-D scale say): they are never folded away.

    Raises:
        ValueError: A fixed input or shape is not a graph input, or a fixed shape contradicts the
            declared one.
    """
    kept = tuple(keep)
    prepared = run_rewrites(model, fixed_inputs, fixed_shapes, kept, REWRITES)
    if prepared.remaining_ifs:

        def probe(shapes: Mapping[str, Sequence[int | str | None]]) -> PreparedModel:
            return run_rewrites(model, fixed_inputs, shapes, kept, DECIDING_REWRITES)

        prepared = dataclasses.replace(prepared, control_flow=ControlFlowAdvice(prepared, fixed_shapes, probe))
    return prepared


def run_rewrites(
    model: onnx.ModelProto,
    fixed_inputs: Mapping[str, np.ndarray] | None,
    fixed_shapes: Mapping[str, Sequence[int | str | None]] | None,
    keep: Iterable[str],
    steps: Sequence[Rewrite],
) -> PreparedModel:
    """Runs the rewrites on a copy of the model (``model`` itself is never changed)."""
    state = Preparation(model, model, dict(fixed_inputs or {}), fixed_shapes, set(keep))
    for rewrite in steps:
        rewrite(state)
    return state.result()
