"""What the rewrites of ``prepare_model`` share: the model under preparation and what they learn."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx

from ortlstm.graphs.export_metadata import TorchOrigins

if TYPE_CHECKING:
    from ortlstm.graphs.prepare.dequantize import Dequantized
    from ortlstm.graphs.prepare.fixed_dims import ExportDim

ONNX_DOMAINS = ("", "ai.onnx")


def is_onnx(node: onnx.NodeProto) -> bool:
    """Whether the node is an ai.onnx op."""
    return node.domain in ONNX_DOMAINS


@dataclasses.dataclass(frozen=True)
class PreparedModel:
    """A model ready for ``build_backward``.

    Attributes:
        model: The prepared model.
        candidates: Float initializers trained by default (see the module docstring), and those
            the caller named to keep; never the values folding created.
        specialized: Names of the ``If`` nodes replaced by a branch.
        converted: Names of the ``LSTMTraining`` nodes that replaced ONNX ``LSTM`` nodes.
        remaining_ifs: Names of the ``If`` nodes left in the main graph (their condition is not
            constant: fix the inputs or input shapes that decide it to differentiate through them).
        sources: For a torch export with metadata, each candidate -> the torch parameters it is
            or was folded from; empty without metadata.
        dropped: Torch parameters the export lost (see ``export_metadata.TorchOrigins``).
        control_flow: For each remaining ``If``, by its first output: what decides it and what to
            pass to fix it, in words (the advice of a refusal that meets it).
        padding_rows: Each embedding table -> its ``padding_idx`` rows, which get no gradient (as
            torch's embedding backward); from a dynamo export's metadata.
        notes: Each candidate whose training differs from torch's in a way the export hides (a
            fused Conv+BatchNorm) -> the warning the train step gives when it trains it.
        refusals: Each candidate that cannot train as torch's parameters do (it shares them with a
            folded tensor that cannot be recomputed) -> the error the train step raises if trained.
        export_dims: The batch and sequence dims the export fixed, each freed or kept with the
            node that depends on it (``fixed_dims``).
        dequantized: The float32 parameters made from int8 weights (``dequantize``).
    """

    model: onnx.ModelProto
    candidates: frozenset[str]
    specialized: tuple[str, ...]
    converted: tuple[str, ...]
    remaining_ifs: tuple[str, ...] = ()
    sources: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    control_flow: Mapping[str, str] = dataclasses.field(default_factory=dict)
    padding_rows: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    notes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    refusals: Mapping[str, str] = dataclasses.field(default_factory=dict)
    export_dims: tuple[ExportDim, ...] = ()
    dequantized: tuple[Dequantized, ...] = ()


@dataclasses.dataclass
class Preparation:
    """The model under preparation; each rewrite of the pipeline changes it in place.

    Attributes:
        source: The model as the caller gave it (never changed; its torch metadata is read).
        model: The working copy (``convert_old_opset`` makes it; the others change it).
        fixed_inputs: Input values the caller fixes (they become initializers).
        fixed_shapes: Input shapes the caller fixes, an int or None (keep) per axis.
        kept: Initializers the caller names to keep as candidates.
        origins: The torch export's metadata, when the model has it.
        initializer_names: The model's own initializers (not the fixed inputs).
        candidates: The float initializers trained by default so far.
        constants: Every value known to be constant, by name.
        specialized: Names of the ``If`` nodes replaced by a branch so far.
        converted: Names of the ``LSTMTraining`` nodes that replaced ONNX ``LSTM`` nodes.
        padding_rows: Each embedding table -> its ``padding_idx`` rows (``torch_folds``).
        notes: Each candidate -> the warning training it deserves (``torch_folds``).
        refusals: Each candidate -> the error training it raises (``torch_folds``).
        export_dims: The dims the export fixed, freed or kept (``fixed_dims.free_export_dims``).
        dequantized: The float32 weights made from int8 ones (``dequantize.dequantize_int8``).
    """

    source: onnx.ModelProto
    model: onnx.ModelProto
    fixed_inputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    fixed_shapes: Mapping[str, Sequence[int | str | None]] | None = None
    kept: set[str] = dataclasses.field(default_factory=set)
    origins: TorchOrigins | None = None
    initializer_names: set[str] = dataclasses.field(default_factory=set)
    candidates: set[str] = dataclasses.field(default_factory=set)
    constants: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    specialized: list[str] = dataclasses.field(default_factory=list)
    converted: tuple[str, ...] = ()
    padding_rows: dict[str, set[int]] = dataclasses.field(default_factory=dict)
    notes: dict[str, str] = dataclasses.field(default_factory=dict)
    refusals: dict[str, str] = dataclasses.field(default_factory=dict)
    export_dims: tuple[ExportDim, ...] = ()
    dequantized: tuple[Dequantized, ...] = ()

    @property
    def graph(self) -> onnx.GraphProto:
        """The working copy's main graph."""
        return self.model.graph

    def is_weight_constant(self, name: str, value: np.ndarray) -> bool:
        """Whether a float constant (a Constant node, a branch's initializer) is a candidate.

        A Constant node filled with one value is a literal of the forward: TorchScript writes
        torch.zeros initial states so, paddle2onnx its LSTMs' zero states (spox and paddle2onnx
        write every weight as a Constant, so the weights among Constants are the other ones).
        """
        if name in self.kept:
            return True
        if self.origins is not None or value.ndim == 0 or value.size == 0:
            return False
        # A tensor of many elements and one value (zeros to Tile or Expand into a state) is a
        # literal, in a model of Constant weights too: paddle2onnx's PP-OCRv2 writes its LSTMs' zero
        # states so. A one-element tensor is a weight (silero-vad's output bias).
        return value.size == 1 or bool(np.any(value != value.reshape(-1)[0]))

    def remaining_ifs(self) -> tuple[str, ...]:
        """Names of the ``If`` nodes left in the main graph."""
        return tuple(node.name for node in self.graph.node if is_onnx(node) and node.op_type == "If")

    def result(self) -> PreparedModel:
        """The prepared model, once every rewrite has run."""
        origins = self.origins
        sources = {name: origins.sources[name] for name in self.candidates if origins and name in origins.sources}
        return PreparedModel(
            self.model,
            frozenset(self.candidates),
            tuple(self.specialized),
            self.converted,
            self.remaining_ifs(),
            sources,
            origins.dropped if origins else (),
            padding_rows={
                name: tuple(sorted(rows)) for name, rows in self.padding_rows.items() if name in self.candidates
            },
            notes={name: note for name, note in self.notes.items() if name in self.candidates},
            refusals=dict(self.refusals),
            export_dims=self.export_dims,
            dequantized=self.dequantized,
        )
