"""What decides an ``If`` that ``prepare_model`` could not replace, and what to pass to fix it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import onnx

from ortlstm.graphs.emit.graph_utils import subgraph_reads
from ortlstm.graphs.prepare.state import PreparedModel, is_onnx

# Sizes a dynamic dim takes while testing whether fixing it decides an If (models take only some
# sizes: silero-vad's rank checks fold for 576 samples and less, not for 1024).
_PROBE_DIMS = (64, 1024)

# Prepares the model again, up to folding, with these fixed shapes.
Probe = Callable[[Mapping[str, Sequence[int | str | None]]], PreparedModel]


class ControlFlowAdvice(Mapping[str, str]):
    """Per remaining ``If`` of a prepared model: what decides it and what to pass, in words.

    Computed when a refusal asks for it: finding the input dims that decide an If prepares the
    model again with each dynamic input dim fixed in turn.
    """

    def __init__(
        self,
        prepared: PreparedModel,
        fixed_shapes: Mapping[str, Sequence[int | str | None]] | None,
        probe: Probe,
    ) -> None:
        """Advice on the remaining ``If`` nodes of ``prepared``.

        Args:
            prepared: The model as prepared.
            fixed_shapes: The input shapes the caller fixed for it.
            probe: Prepares the model again (up to folding) with other fixed shapes.
        """
        self._fixed_shapes = {name: list(dims) for name, dims in (fixed_shapes or {}).items()}
        self._prepared = prepared
        self._probe = probe
        self._ifs = _if_nodes(prepared.model.graph)
        self._advice: dict[str, str] = {}
        self._deciding: dict[str, dict[str, list[int]]] | None = None

    def __getitem__(self, name: str) -> str:
        if name not in self._ifs:
            raise KeyError(name)
        if name not in self._advice:
            self._advice[name] = self._describe(name)
        return self._advice[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._ifs)

    def __len__(self) -> int:
        return len(self._ifs)

    def _dims_deciding(self) -> dict[str, dict[str, list[int]]]:
        """Per remaining If (by first output), the input dims that decide it: fixing one alone replaces it."""
        if self._deciding is None:
            self._deciding = {}
            graph = self._prepared.model.graph
            for value in graph.input:
                declared = _declared_dims(graph, value.name) or []
                for axis, dim in enumerate(declared):
                    if not isinstance(dim, int):
                        for if_name in self._decided_by(value.name, len(declared), axis):
                            self._deciding.setdefault(if_name, {}).setdefault(value.name, []).append(axis)
        return self._deciding

    def _decided_by(self, name: str, rank: int, axis: int) -> set[str]:
        """The remaining Ifs that fixing dim ``axis`` of input ``name`` replaces, at some probe size."""
        decided: set[str] = set()
        for size in _PROBE_DIMS:
            shapes = {key: list(dims) for key, dims in self._fixed_shapes.items()}
            shapes.setdefault(name, [None] * rank)[axis] = size
            try:
                probe = self._probe(shapes)
            except Exception:  # a size the model cannot take decides nothing
                continue
            decided |= set(self._ifs) - set(_if_nodes(probe.model.graph))
        return decided

    def _describe(self, key: str) -> str:
        graph = self._prepared.model.graph
        node = self._ifs[key]
        label = f"If {node.name!r}" if node.name else f"The If computing {key!r}"
        values, shape_reads = _condition_sources(graph, node.input[0])
        parts: list[str] = []
        options: list[str] = []
        flags: list[str] = []  # the command line's spelling of the same options
        if values:
            parts.append("the value of input " + " and ".join(map(repr, values)))
            options.append("fixed_inputs={" + ", ".join(f"{name!r}: <value>" for name in values) + "}")
            flags.extend(f"--fixed-input {name}=VALUE" for name in values)
        if shape_reads:
            decided = self._dims_deciding().get(key) or {
                name: [] for name in _inputs_reaching(graph, shape_reads) if name not in values
            }
            for name, axes in decided.items():
                declared = _declared_dims(graph, name) or []
                which = f"dim {', '.join(map(str, axes))}" if axes else "no single dim decides it"
                parts.append(f"the shape of input {name!r} ({which})")
                chosen = [axis in axes or (not axes and not isinstance(dim, int)) for axis, dim in enumerate(declared)]
                dims = [f"<size of dim {axis}>" if fix else "None" for axis, fix in enumerate(chosen)]
                options.append(f"fixed_shapes={{{name!r}: [{', '.join(dims)}]}}")
                spelled = ",".join(f"SIZE{axis}" if fix else "?" for axis, fix in enumerate(chosen))
                flags.append(f"--fixed-shape {name}={spelled}")
        if not parts:
            return (
                f"{label}: its condition is computed at run time from values training cannot fix; "
                "its branches are not differentiated (freeze the parameters they read)."
            )
        return (
            f"{label} is decided by {' and by '.join(parts)}; control flow is not differentiated, so fix it "
            f"for training: pass {' and '.join(options)} ({' '.join(flags)} on the command line; the If is then "
            "replaced by the branch chosen)."
        )


def _if_nodes(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """The main graph's ``If`` nodes by first output (node names may be empty or repeated)."""
    return {node.output[0]: node for node in graph.node if is_onnx(node) and node.op_type == "If"}


def _condition_sources(graph: onnx.GraphProto, condition: str) -> tuple[list[str], list[str]]:
    """The graph inputs a condition reads by value, and the values whose shape (or size) it reads."""
    producers = {name: node for node in graph.node for name in node.output if name}
    inputs = {value.name for value in graph.input} - {init.name for init in graph.initializer}
    values: list[str] = []
    shape_reads: list[str] = []
    seen: set[str] = set()
    stack = [condition]
    while stack:
        name = stack.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        if name in inputs:
            values.append(name)
            continue
        node = producers.get(name)
        if node is None:
            continue
        if is_onnx(node) and node.op_type in ("Shape", "Size"):
            shape_reads.append(node.input[0])
            continue
        stack.extend(node.input)
        stack.extend(subgraph_reads(node))
    return values, shape_reads


def _declared_dims(graph: onnx.GraphProto, name: str) -> list[int | str | None] | None:
    value = next(value for value in graph.input if value.name == name)
    if not value.type.tensor_type.HasField("shape"):
        return None
    return [
        dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
        for dim in value.type.tensor_type.shape.dim
    ]


def _inputs_reaching(graph: onnx.GraphProto, names: Sequence[str]) -> list[str]:
    producers = {name: node for node in graph.node for name in node.output if name}
    inputs = {value.name for value in graph.input}
    found: list[str] = []
    seen: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found.append(name)
        node = producers.get(name)
        if node is not None:
            stack.extend(node.input)
    return found
