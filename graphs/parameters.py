"""How a train step names its parameters: torch's defaults, ``requires_grad``, ``frozen``, ``param_groups``.

By default a train step trains what PyTorch trains (``prepare.prepare_model`` decides the
candidates: torch parameters from the export's metadata, or float tensors of rank >= 1 without
it) that reach the loss. Every option that names parameters (``requires_grad``, ``frozen``, a
``ParamGroup``'s ``params``, on the Trainer and on the command line) goes through one resolver,
``ParameterNames.select``, because torch users name parameters as their ``nn.Module`` does and an
optimized dynamo export renames them (``val_29``). A name is one of:

- an initializer's own name (``val_29``, ``head.bias``);
- the torch parameter an initializer is or was folded from, as the export metadata records it
  (``graphs/export_metadata.py``): an initializer folded from several (an LSTM layer's B from
  ``lstm.bias_ih_l0`` and ``lstm.bias_hh_l0``) answers to each of their names, and since one
  tensor cannot be half trained, names that select some of them and not the others are refused;
- a glob (``"lstm.*"``, ``"*.bias"``, ``fnmatch`` syntax);
- a module prefix (``"lstm"`` selects ``lstm.weight_ih_l0``).

A name that selects nothing is an error listing the valid names (torch names with their ONNX
initializer); errors that name a parameter say ``torch_name (onnx: val_29)`` where the metadata
knows it (``ParameterNames.label``).

Protos and NumPy only.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import onnx

from ortlstm.graphs.emit.graph_utils import walk_graphs
from ortlstm.graphs.export_metadata import read_torch_origins

if TYPE_CHECKING:
    from ortlstm.graphs.optimizers.base import ParamGroup

LISTED = 20
"""How many valid names a refusal lists before ``... N more`` (those near the miss are always listed)."""

HOW_TO_NAME = "its ONNX initializer name, its torch name, a glob ('lstm.*', '*.bias') or a module prefix ('lstm')"


@dataclasses.dataclass(frozen=True)
class TrainedParameter:
    """One trained initializer, for summaries.

    Attributes:
        name: The initializer's name in the model.
        shape: Its shape.
        dtype: Its NumPy element type's name.
        sources: The torch parameters it is or was folded from (empty when the export does not say).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    sources: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        """The number of values."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count


def matches(pattern: str, name: str) -> bool:
    """Whether ``pattern`` (exact name, glob or module prefix) selects ``name``."""
    return name == pattern or fnmatch.fnmatchcase(name, pattern) or name.startswith(pattern + ".")


def torch_sources(model: onnx.ModelProto) -> dict[str, tuple[str, ...]]:
    """Initializer -> the torch parameters it is or was folded from, by the export's metadata (empty without it)."""
    origins = read_torch_origins(model)
    return dict(origins.sources) if origins is not None else {}


def constant_sources(model: onnx.ModelProto) -> dict[str, str]:
    """``Constant`` node output -> where the model first reads it (``W of GRU '/emb_gru/GRU'``), for summaries.

    Some exporters write weights as ``Constant`` nodes, not initializers (torch 1.13's TorchScript
    export of DeepFilterNet3's GRUs, spox's silero). Training makes each one a parameter (prepare's
    ``fold_constants``) and export writes it back into its node, so the summary says which of the
    trained tensors the user will find as a node, not an initializer, in the file they hold.
    """
    readers: dict[str, str] = {}
    for graph in walk_graphs(model.graph):
        for node in graph.node:
            for index, name in enumerate(node.input):
                readers.setdefault(name, _port(node, index))
    return {
        node.output[0]: readers.get(node.output[0], "read by no node")
        for graph in walk_graphs(model.graph)
        for node in graph.node
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1
    }


def _port(node: onnx.NodeProto, index: int) -> str:
    """``W of GRU 'name'``: the input's name in the op's ONNX schema, or its position where onnx has no schema."""
    try:
        inputs = onnx.defs.get_schema(node.op_type, domain=node.domain).inputs
        port = inputs[min(index, len(inputs) - 1)].name if inputs else f"input {index}"
    except onnx.defs.SchemaError:
        port = f"input {index}"
    return f"{port} of {node.op_type} {node.name!r}"


def label(name: str, sources: Mapping[str, tuple[str, ...]]) -> str:
    """``name`` as errors show it: ``torch_name (onnx: val_29)`` where the metadata knows the torch name(s)."""
    torch_names = sources.get(name, ())
    if not torch_names or torch_names == (name,):
        return name
    return f"{' + '.join(torch_names)} (onnx: {name})"


@dataclasses.dataclass(frozen=True)
class ParameterNames:
    """The names a model's parameters answer to, and the one resolver of names to initializers.

    Attributes:
        initializers: The initializers a name may select, in the model's order.
        sources: Initializer -> the torch parameters it is or was folded from (export metadata).
        known: Other names a pattern may match without selecting anything (buffers, parameters
            the export dropped, frozen ones): a pattern that matches only those is not an error.
        noun: What ``initializers`` are, for the refusals ("parameter", "trained parameter").
        dropped: Torch parameters the export lost (``export_metadata.TorchOrigins.dropped``): a
            refusal of a name that selects one says so, and how to keep it.
        untrained: The model's other initializers (frozen, not in ``requires_grad``, buffers): a
            refusal of a name that selects only those says that they are not trained.
    """

    initializers: tuple[str, ...]
    sources: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    known: frozenset[str] = frozenset()
    noun: str = "parameter"
    dropped: tuple[str, ...] = ()
    untrained: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        initializers: Iterable[str],
        sources: Mapping[str, tuple[str, ...]],
        known: Collection[str] = (),
        noun: str = "parameter",
        dropped: Sequence[str] = (),
        untrained: Sequence[str] = (),
    ) -> ParameterNames:
        """The names of ``initializers`` (duplicates dropped, order kept)."""
        return cls(
            tuple(dict.fromkeys(initializers)), dict(sources), frozenset(known), noun, tuple(dropped), tuple(untrained)
        )

    def label(self, name: str) -> str:
        """``name`` as errors show it (``torch_name (onnx: val_29)``)."""
        return label(name, self.sources)

    def select(self, option: str, patterns: Sequence[str], verb: str = "select") -> list[str]:
        """The initializers ``patterns`` select: for each pattern in turn, its matches in the model's order.

        Args:
            option: The option, for the refusals (``"requires_grad"``, ``"frozen"``, ``"param_groups[0]"``).
            patterns: Names, torch names, globs or module prefixes.
            verb: What selecting does, for the refusals (``"freeze"``).

        Raises:
            ValueError: A pattern selects nothing (and matches none of ``known``), or the patterns
                select some of the torch parameters one initializer is folded from but not all.
        """
        if isinstance(patterns, str):
            raise TypeError(f"{option}: expected a list of names, got the string {patterns!r}; pass [{patterns!r}]")
        selected: dict[str, None] = {}
        for pattern in patterns:
            selected.update(dict.fromkeys(name for name in self.initializers if self._selects(pattern, name)))
        for name in selected:
            self._check_whole(option, name, patterns, verb)
        every_name = {*self.initializers, *self.known, *self._torch_names()}
        unmatched = [pattern for pattern in patterns if not any(matches(pattern, name) for name in every_name)]
        if unmatched:
            raise ValueError(self.refusal(option, unmatched))
        return list(selected)

    def _torch_names(self) -> list[str]:
        """The torch parameters behind the selectable initializers, in the model's order."""
        return [source for name in self.initializers for source in self.sources.get(name, ())]

    def _selects(self, pattern: str, name: str) -> bool:
        return matches(pattern, name) or any(matches(pattern, source) for source in self.sources.get(name, ()))

    def _check_whole(self, option: str, name: str, patterns: Sequence[str], verb: str) -> None:
        """Refuses patterns that select an initializer by some of its torch parameters only."""
        torch_names = self.sources.get(name, ())
        if any(matches(pattern, name) for pattern in patterns) or len(torch_names) < 2:
            return
        chosen = [source for source in torch_names if any(matches(pattern, source) for pattern in patterns)]
        if len(chosen) < len(torch_names):
            others = [source for source in torch_names if source not in chosen]
            raise ValueError(
                f"{option}: {name!r} is one tensor folded from torch parameters {list(torch_names)}; the names "
                f"{verb} {chosen} but not {others}, and one tensor cannot be half trained. Name all of them "
                f"({name!r} or {list(torch_names)}), or none (export with optimize=False to keep them apart)"
            )

    def valid_names(self, misses: Sequence[str] = ()) -> list[str]:
        """Every name a pattern may use: each torch name with its initializer, or the initializer's name alone.

        Listed in the model's order; past ``LISTED`` entries the rest is counted, except those that
        share a module prefix with a miss (``lstm.weight_ih_l9`` keeps every ``lstm.*`` listed).
        """
        entries: list[tuple[str, str]] = []  # (a name a pattern may use, how it is listed)
        for name in self.initializers:
            torch_names = self.sources.get(name, ())
            if not torch_names or torch_names == (name,):
                entries.append((name, name))
            else:
                entries.extend((source, f"{source} (onnx: {name})") for source in torch_names)
        if len(entries) <= LISTED:
            return [shown for _, shown in entries]
        prefixes = {miss.split(".", 1)[0].rstrip("*?[") for miss in misses}
        prefixes.discard("")
        near = [
            shown
            for index, (name, shown) in enumerate(entries)
            if index >= LISTED and any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)
        ]
        listed = [shown for _, shown in entries[:LISTED]] + near
        return [*listed, f"... {len(entries) - len(listed)} more"] if len(entries) > len(listed) else listed

    def refusal(self, option: str, misses: Sequence[str]) -> str:
        """The error for ``misses``, names that select nothing: the valid names and close matches."""
        every_name = [*self.initializers, *self._torch_names()]
        modules = [name.rsplit(".", depth)[0] for name in every_name for depth in range(1, name.count(".") + 1)]
        spellings = list(dict.fromkeys([*every_name, *modules]))  # "decoder" is close to the module "encoder"
        lost = [name for name in self.dropped if any(matches(miss, name) for miss in misses)]
        idle = [
            miss
            for miss in misses
            if any(self._selects(miss, name) for name in self.untrained if name not in self.initializers)
        ]
        typos = [miss for miss in misses if not any(matches(miss, name) for name in lost) and miss not in idle]
        close = [candidate for miss in typos for candidate in _closest(miss, spellings)]
        subject = f"{misses[0]!r} matches" if len(misses) == 1 else f"{list(misses)} match"
        message = f"{option}: {subject} no {self.noun} of the model"
        if close:
            message += f" (did you mean {' or '.join(map(repr, dict.fromkeys(close)))}?)"
        if lost:
            message += (
                f"; the export dropped torch parameters {lost} (torch.onnx.export's optimizer removes a zero-valued "
                "bias and merges equal tensors): export with optimize=False to keep them"
            )
        if idle:
            message += (
                f"; {', '.join(map(repr, idle))} {'names' if len(idle) == 1 else 'name'} only parameters that are not "
                "trained (frozen, left out of requires_grad, or not reaching the loss): a group sets how trained "
                "parameters train (torch would ignore it), so leave those out of it or train them"
            )
        listed = self.valid_names(misses)
        if not listed:
            return message + f"; it has no {self.noun}s to name"
        return f"{message}. Its {self.noun}s are: {', '.join(listed)}. Name a {self.noun} by {HOW_TO_NAME}"

    def resolve_groups(self, param_groups: Sequence[ParamGroup]) -> tuple[ParamGroup, ...]:
        """``param_groups`` with each group's ``params`` resolved to initializer names, as torch takes them.

        Raises:
            ValueError: A group names nothing of ``initializers``, or a parameter falls in two groups
                (torch's ``some parameters appear in more than one parameter group``).
        """
        resolved = []
        owner: dict[str, int] = {}
        for index, group in enumerate(param_groups):
            names = self.select(f"param_groups[{index}]", group.params, verb="put in the group")
            twice = [name for name in names if name in owner]
            if twice:
                where = ", ".join(f"{self.label(name)} in groups {owner[name]} and {index}" for name in twice)
                raise ValueError(f"some parameters appear in more than one parameter group: {where}")
            owner.update(dict.fromkeys(names, index))
            resolved.append(dataclasses.replace(group, params=tuple(names)))
        return tuple(resolved)


def _closest(miss: str, spellings: Sequence[str]) -> list[str]:
    """The spellings nearest to ``miss`` (difflib), the runners-up only when as near as the best."""
    close = difflib.get_close_matches(miss, spellings)
    ratios = {name: difflib.SequenceMatcher(None, miss, name).ratio() for name in close}
    return [name for name, ratio in ratios.items() if ratio >= max(ratios.values()) - 0.02]


def resolve_frozen(
    patterns: Sequence[str],
    initializers: Iterable[str],
    sources: Mapping[str, tuple[str, ...]],
    known: Collection[str] = (),
) -> set[str]:
    """The initializers that ``patterns`` freeze (``ParameterNames.select`` with the verb "freeze").

    Args:
        patterns: Names, globs or module prefixes.
        initializers: The model's trainable initializers.
        sources: Initializer -> the torch parameters it was folded from (export metadata).
        known: Other names a pattern may match without freezing anything (buffers, parameters
            the export dropped): a pattern that matches only those is not an error.

    Raises:
        ValueError: A pattern matches no name of the model, or freezes only some of the torch
            parameters one initializer is folded from.
    """
    return set(ParameterNames.of(initializers, sources, known).select("frozen", patterns, verb="freeze"))


def freeze_hint(parameters: Sequence[str], sources: Mapping[str, tuple[str, ...]] | None = None) -> str:
    """The ``frozen=`` value that leaves ``parameters`` out, and their module's glob if they share one.

    With ``sources`` (export metadata) the value names the torch parameters, as their torch model does.
    """
    names = sorted({source for name in parameters for source in (sources or {}).get(name, (name,))})
    hint = f"frozen={names!r}"
    modules = {name.split(".", 1)[0] for name in names}
    if len(names) > 1 and len(modules) == 1 and all("." in name for name in names):
        hint += f", or frozen=[{next(iter(modules)) + '.*'!r}] for the whole module"
    return hint


def describe_trained(
    trained: Sequence[TrainedParameter],
    frozen: Sequence[str] = (),
    sources: Mapping[str, tuple[str, ...]] | None = None,
    int8: Sequence[str] = (),
    constants: Mapping[str, str] | None = None,
) -> str:
    """A table of the trained parameters (name, type, shape, values, the torch parameters behind each).

    The frozen ones are listed after it, named as errors name them (``label``) when ``sources`` knows them;
    then ``int8``, the lines that say which parameters were dequantized from an int8 model's weights;
    then the trained parameters that ``constants`` (``constant_sources``) says were ``Constant`` nodes.
    """
    lines = [f"trains {len(trained)} parameters, {sum(p.size for p in trained):,} values:"]
    width = max(len(p.name) for p in trained)
    for parameter in trained:
        shape = "[" + ", ".join(map(str, parameter.shape)) + "]"
        renamed = parameter.sources and parameter.sources != (parameter.name,)
        origin = f"  <- {', '.join(parameter.sources)}" if renamed else ""
        lines.append(f"  {parameter.name:<{width}}  {parameter.dtype:<7} {shape:<16} {parameter.size:>10,}{origin}")
    if frozen:
        lines.append(f"frozen (constants): {', '.join(label(name, sources or {}) for name in frozen)}")
    if int8:
        lines.append("dequantized from int8 to float32 (export(path, quantize='dynamic') writes int8 again):")
        lines.extend(f"  {line}" for line in int8)
    nodes = {p.name: constants[p.name] for p in trained if constants and p.name in constants}
    if nodes:
        lines.append("Constant nodes in the model, trained as parameters (export() writes each back into its node):")
        lines.extend(f"  {name} <- {reader}" for name, reader in nodes.items())
    return "\n".join(lines)
