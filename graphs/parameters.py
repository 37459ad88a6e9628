"""Which initializers a train step trains: torch's defaults, ``requires_grad`` and ``frozen``.

By default a train step trains what PyTorch trains (``prepare.prepare_model`` decides the
candidates: torch parameters from the export's metadata, or float tensors of rank >= 1 without
it) that reach the loss. ``frozen`` takes names or patterns, as torch users freeze whole modules:
an exact name, a glob (``"FeatureExtraction.*"``, ``fnmatch`` syntax) or a module prefix
(``"FeatureExtraction"`` freezes ``FeatureExtraction.conv0.weight``). A pattern matches an
initializer by its own name or, for an initializer folded from torch parameters (an LSTM
layer's W stacks ``lstm.weight_ih_l0`` and ``lstm.weight_ih_l0_reverse``), by those parameters'
names: such an initializer is frozen when all of them are.

Protos and NumPy only.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Collection, Iterable, Mapping, Sequence


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


def resolve_frozen(
    patterns: Sequence[str],
    initializers: Iterable[str],
    sources: Mapping[str, tuple[str, ...]],
    known: Collection[str] = (),
) -> set[str]:
    """The initializers that ``patterns`` freeze.

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
    initializers = list(initializers)
    frozen: set[str] = set()
    for name in initializers:
        if any(matches(pattern, name) for pattern in patterns):
            frozen.add(name)
            continue
        torch_names = sources.get(name, ())
        selected = [source for source in torch_names if any(matches(pattern, source) for pattern in patterns)]
        if selected and len(selected) < len(torch_names):
            trained = [source for source in torch_names if source not in selected]
            raise ValueError(
                f"frozen: {name!r} is one tensor folded from torch parameters {list(torch_names)}; the patterns freeze "
                f"{selected} but not {trained}, and one tensor cannot be half trained. Freeze all of them, "
                f"or none (export with optimize=False to keep them apart)"
            )
        if selected:
            frozen.add(name)
    every_name = {*initializers, *known, *(source for names in sources.values() for source in names)}
    unmatched = [pattern for pattern in patterns if not any(matches(pattern, name) for name in every_name)]
    if unmatched:
        raise ValueError(
            f"frozen: {unmatched} match no parameter of the model; its trainable initializers are "
            f"{sorted(initializers)}"
            + (f" (torch names: {sorted(set(every_name) - set(initializers))})" if sources else "")
        )
    return frozen


def freeze_hint(parameters: Sequence[str]) -> str:
    """The ``frozen=`` value that leaves ``parameters`` out, and their module's glob if they share one."""
    hint = f"frozen={sorted(parameters)!r}"
    modules = {name.split(".", 1)[0] for name in parameters}
    if len(parameters) > 1 and len(modules) == 1 and all("." in name for name in parameters):
        hint += f", or frozen=[{next(iter(modules)) + '.*'!r}] for the whole module"
    return hint


def describe_trained(trained: Sequence[TrainedParameter], frozen: Sequence[str] = ()) -> str:
    """A table of the trained parameters (name, type, shape, values, the torch parameters behind each).

    The frozen ones are listed after it.
    """
    lines = [f"trains {len(trained)} parameters, {sum(p.size for p in trained):,} values:"]
    width = max(len(p.name) for p in trained)
    for parameter in trained:
        shape = "[" + ", ".join(map(str, parameter.shape)) + "]"
        renamed = parameter.sources and parameter.sources != (parameter.name,)
        origin = f"  <- {', '.join(parameter.sources)}" if renamed else ""
        lines.append(f"  {parameter.name:<{width}}  {parameter.dtype:<7} {shape:<16} {parameter.size:>10,}{origin}")
    if frozen:
        lines.append(f"frozen (constants): {', '.join(frozen)}")
    return "\n".join(lines)
