"""What a torch.onnx.export model says about its initializers: which are torch parameters.

torch 2.13's dynamo exporter writes the ExportedProgram's graph signature into the graph's
metadata (``pkg.torch.export.ExportedProgram.graph_signature``, one line per input such as
``p_lstm_weight_ih_l0: PARAMETER target='lstm.weight_ih_l0'`` or ``b_bn_running_mean: BUFFER
target='bn.running_mean' persistent=True``) and the kind of each lifted initializer into its
value_info (``pkg.torch.export.graph_signature.InputSpec.kind``). With ``optimize=True``,
onnxscript's optimizer folds constant subgraphs and records on each folded initializer what it
was folded from (``pkg.onnxscript.optimizer.folded_from``): an LSTM layer's W lists
``lstm.weight_ih_l0`` and ``lstm.weight_ih_l0_reverse`` among intermediate values, a zero initial
state lists intermediates only. Read together they say which initializers torch trains, and which
torch parameters the optimizer dropped (a zero-valued bias is removed as an addition of zeros).

Protos only. Models without this metadata (TorchScript exports, paddle2onnx, spox) get None.
"""

from __future__ import annotations

import ast
import dataclasses
import re

import onnx

SIGNATURE_KEY = "pkg.torch.export.ExportedProgram.graph_signature"
KIND_KEY = "pkg.torch.export.graph_signature.InputSpec.kind"
FOLDED_FROM_KEY = "pkg.onnxscript.optimizer.folded_from"
PARAMETER = "PARAMETER"

# "p_lstm_weight_ih_l0: PARAMETER target='lstm.weight_ih_l0'" (USER_INPUT lines have no target).
_SIGNATURE_LINE = re.compile(r"^\s*(?P<node>[\w.]+): (?P<kind>[A-Z_]+)(?: target='(?P<target>[^']*)')?")


@dataclasses.dataclass(frozen=True)
class TorchOrigins:
    """The torch side of an exported model's initializers.

    Attributes:
        kinds: Each torch input target (``lstm.weight_ih_l0``) -> its kind (PARAMETER, BUFFER,
            CONSTANT_TENSOR, ...).
        sources: Each initializer that is, or was folded from, torch parameters -> those
            parameters' names (an unfolded parameter: its own name).
        dropped: Torch parameters that no initializer is or was folded from: the exporter's
            optimizer removed them (a zero bias) or merged them into an equal initializer.
    """

    kinds: dict[str, str]
    sources: dict[str, tuple[str, ...]]
    dropped: tuple[str, ...]


def _signature_kinds(graph: onnx.GraphProto) -> dict[str, str]:
    text = next((prop.value for prop in graph.metadata_props if prop.key == SIGNATURE_KEY), "")
    kinds: dict[str, str] = {}
    for line in text.split("# outputs", 1)[0].splitlines():
        match = _SIGNATURE_LINE.match(line)
        if match and match["target"]:
            kinds[match["target"]] = match["kind"]
    return kinds


def _metadata(value: onnx.ValueInfoProto | onnx.TensorProto) -> dict[str, str]:
    return {prop.key: prop.value for prop in value.metadata_props}


def _folded_from(text: str) -> list[str]:
    try:
        names = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return [name for name in names if isinstance(name, str)] if isinstance(names, (list, tuple)) else []


def read_torch_origins(model: onnx.ModelProto) -> TorchOrigins | None:
    """The torch origins of ``model``'s initializers, or None when the export records none."""
    graph = model.graph
    kinds = _signature_kinds(graph)
    described = {value.name: _metadata(value) for value in [*graph.value_info, *graph.input]}
    for init in graph.initializer:
        described.setdefault(init.name, {}).update(_metadata(init))
    for name, metadata in described.items():
        if KIND_KEY in metadata:
            kinds.setdefault(name, metadata[KIND_KEY])
    if not kinds:
        return None
    sources: dict[str, tuple[str, ...]] = {}
    for init in graph.initializer:
        if kinds.get(init.name) == PARAMETER:
            sources[init.name] = (init.name,)
            continue
        folded = _folded_from(described.get(init.name, {}).get(FOLDED_FROM_KEY, "[]"))
        parameters = tuple(sorted(name for name in folded if kinds.get(name) == PARAMETER))
        if parameters:
            sources[init.name] = parameters
    covered = {name for names in sources.values() for name in names}
    dropped = tuple(name for name, kind in kinds.items() if kind == PARAMETER and name not in covered)
    return TorchOrigins(kinds, sources, dropped)
