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

Each node also records the torch call it was translated from (``pkg.torch.onnx.fx_node``, e.g.
``call_function[target=torch.ops.aten.embedding.default](args = (%p_emb_weight, %x, 0), ...)``):
``fx_call`` reads it, so the rewrites can tell which torch parameters a node stands for (two
LayerNorms that read one merged tensor still name their own parameters), an embedding's
``padding_idx``, and a Conv whose call is the BatchNorm folded into it.

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
FX_NODE_KEY = "pkg.torch.onnx.fx_node"
PARAMETER = "PARAMETER"
# The ops onnxscript's optimizer folds an eval-mode BatchNormalization into (Conv2d + BatchNorm2d,
# Linear + BatchNorm1d), keeping their initializer names; their weight and bias are inputs 1 and 2.
FUSES_BATCHNORM = ("Conv", "Gemm")

# "p_lstm_weight_ih_l0: PARAMETER target='lstm.weight_ih_l0'" (USER_INPUT lines have no target).
_SIGNATURE_LINE = re.compile(r"^\s*(?P<node>[\w.]+): (?P<kind>[A-Z_]+)(?: target='(?P<target>[^']*)')?")
# "... = call_function[target=torch.ops.aten.embedding.default](args = (%p_emb_weight, %x, 0), kwargs = {})"
_FX_CALL = re.compile(r"call_function\[target=(?P<target>[\w.]+)\]\(args = \((?P<args>.*)\), kwargs = ")


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
        placeholders: Each placeholder of the exported program (``p_ln2_weight``, as the nodes'
            ``fx_call`` args name them) -> its torch target (``ln2.weight``).
        tied: Torch parameters without a tensor of their own that no node's torch call names:
            torch.export reads a parameter tied to another (``head.weight = emb.weight``) through
            the other's placeholder, so it is trained as that one (not in ``dropped``).
    """

    kinds: dict[str, str]
    sources: dict[str, tuple[str, ...]]
    dropped: tuple[str, ...]
    placeholders: dict[str, str] = dataclasses.field(default_factory=dict)
    tied: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class FxCall:
    """The torch call an exported node was translated from (its ``pkg.torch.onnx.fx_node``).

    Attributes:
        target: The aten op, e.g. ``torch.ops.aten.embedding.default``.
        args: The call's positional arguments as written (``%p_emb_weight``, ``0``, ``[4]``).
    """

    target: str
    args: tuple[str, ...]

    def placeholders(self) -> tuple[str, ...]:
        """The placeholders (``p_ln2_weight``, ``b_bn_running_mean``) the call reads, in order."""
        return tuple(arg[1:] for arg in self.args if arg.startswith("%"))


def fx_call(node: onnx.NodeProto) -> FxCall | None:
    """The torch call recorded on ``node`` by torch's dynamo exporter, or None."""
    text = next((prop.value for prop in node.metadata_props if prop.key == FX_NODE_KEY), "")
    match = _FX_CALL.search(text)
    if match is None:
        return None
    return FxCall(match["target"], tuple(_split_args(match["args"])))


def batch_norm_in_train_mode(call: FxCall | None) -> bool:
    """Whether ``call`` is torch's batch_norm with ``training=True`` (the model was exported in train mode).

    torch.onnx.export(dynamo=True) of a model in train mode writes an inference BatchNormalization
    (running statistics) for ``aten._native_batch_norm_legit_functional(x, w, b, mean, var, True, ...)``:
    the export's forward is not the one torch trains. The 6th argument is ``training`` in that call
    and in ``aten.batch_norm``; ``_native_batch_norm_legit_no_training`` has none.
    """
    return (
        call is not None
        and "batch_norm" in call.target
        and "no_training" not in call.target
        and call.args[5:6] == ("True",)
    )


def _split_args(text: str) -> list[str]:
    """Splits ``a, [1, 2], b`` at the commas outside brackets."""
    args: list[str] = []
    depth, start = 0, 0
    for position, char in enumerate(text):
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            args.append(text[start:position].strip())
            start = position + 1
    if text[start:].strip():
        args.append(text[start:].strip())
    return args


def _signature_kinds(graph: onnx.GraphProto) -> tuple[dict[str, str], dict[str, str]]:
    """Each torch target -> its kind, and each placeholder -> its target, from the graph signature."""
    text = next((prop.value for prop in graph.metadata_props if prop.key == SIGNATURE_KEY), "")
    kinds: dict[str, str] = {}
    placeholders: dict[str, str] = {}
    for line in text.split("# outputs", 1)[0].splitlines():
        match = _SIGNATURE_LINE.match(line)
        if match and match["target"]:
            kinds[match["target"]] = match["kind"]
            placeholders[match["node"]] = match["target"]
    return kinds, placeholders


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
    kinds, placeholders = _signature_kinds(graph)
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
    for init_name, parameters in fused_batchnorms(graph, placeholders, kinds).items():
        sources[init_name] = (*sources.get(init_name, ()), *parameters)
    covered = {name for names in sources.values() for name in names}
    missing = [name for name, kind in kinds.items() if kind == PARAMETER and name not in covered]
    # A removed zero bias is still named by its node's call (aten.linear(%x, %p_w, %p_b)); a tied
    # parameter by none, when the calls are recorded at all.
    calls = [call for call in map(fx_call, graph.node) if call is not None]
    named = {placeholders.get(name) for call in calls for name in call.placeholders()}
    tied = tuple(name for name in missing if calls and name not in named)
    dropped = tuple(name for name in missing if name not in tied)
    return TorchOrigins(kinds, sources, dropped, placeholders, tied)


def fused_batchnorms(
    graph: onnx.GraphProto, placeholders: dict[str, str], kinds: dict[str, str]
) -> dict[str, tuple[str, ...]]:
    """Each Conv (or Gemm) weight or bias a BatchNorm was folded into -> the BatchNorm's torch parameters.

    onnxscript's optimizer fuses ``Conv`` (``Gemm``) + ``BatchNormalization`` (eval mode) into one node that
    keeps the Conv's initializer names and records the BatchNorm's call on the node: such a
    tensor is ``conv.weight * bn.weight / sqrt(bn.running_var + eps)``, not torch's ``conv.weight``.
    """
    fused: dict[str, tuple[str, ...]] = {}
    for node in graph.node:
        call = fx_call(node) if node.op_type in FUSES_BATCHNORM and node.domain in ("", "ai.onnx") else None
        if call is None or "batch_norm" not in call.target:
            continue
        parameters = tuple(
            placeholders[name] for name in call.placeholders() if kinds.get(placeholders.get(name, "")) == PARAMETER
        )
        for init_name in node.input[1:3]:
            if init_name:
                fused[init_name] = parameters
    return fused
