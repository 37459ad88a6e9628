"""What an op family is made of: the facts codegen and onnx_defs read, declared once beside the family's ops.

A family is a group of ops that the generated files render alike (one doc heading, one way to name
attributes in the C++ header, one flag per input, one rule for the output shapes). Each ``spec_*``
module declares its family next to its ops and ``ops/schema.py`` gathers them in ``FAMILIES``;
``codegen`` and ``onnx_defs`` iterate ``FAMILIES`` and never name a family, so a new family edits
neither of them. Pure data (standard library only), like the rest of the contract.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

from ortlstm.ops.contract import OpSpec


@dataclasses.dataclass(frozen=True)
class AxisOf:
    """One output axis read off an input's shape: ``factor * shape(input)[axis] + offset``.

    The axis is unknown (onnx: no dim; C++: -1) where the input is absent, has no shape, has a rank
    other than ``rank`` (None: any rank that has the axis) or, with a factor or offset, a symbolic dim.
    """

    input: str
    axis: int
    rank: int | None = None
    factor: int = 1
    offset: int = 0


@dataclasses.dataclass(frozen=True)
class OutputShape:
    """How one output's element type and shape follow from the node's inputs.

    The output takes the element type of input ``like``. Its shape is ``like``'s whole shape
    (``axes`` None) or the listed axes; it is known only where ``like`` has a shape, and, with
    ``rank``, only where that shape has this rank (the kernel refuses any other).
    """

    output: str
    like: str
    axes: tuple[AxisOf, ...] | None = None
    rank: int | None = None


@dataclasses.dataclass(frozen=True)
class InputFlag:
    """A per-input boolean array in the C++ header, ``kInput<name>[kNumInputs]``.

    An input's entry is true where every type its constraint allows is one of ``types``: the
    kernel's GetInputType reads it (say, the float64 scalars of an optimizer, the integer ports of CTC).
    """

    name: str
    types: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Family:
    """The facts of one op family that the generated files branch on.

    Attributes:
        name: The family's name, for messages.
        ops: Its ops, in documentation order.
        doc_label: Its label in docs/ops.md's list of ops ("the GRU", "the CTC loss").
        shared_attributes: Names of its attributes that live in the header's shared ``attr::``
            namespace (the LSTM ops' attributes); the others are named in each op's namespace.
        attribute_accepts: Whether the op's own attributes render their accepted values too (for
            the messages of a kernel that checks them by hand).
        input_flags: Per-input boolean arrays of the header.
        output_shapes: Per op name, how its outputs' types and shapes follow from the inputs (onnx
            shape inference and the generated C++ ``OutputShape``); None: every output's shape is
            its spec shape (``PortSpec.shape``) over the dims bound from the attributes and inputs.
            An output without a rule gets no inferred type.
    """

    name: str
    ops: tuple[OpSpec, ...]
    doc_label: str
    shared_attributes: tuple[str, ...] = ()
    attribute_accepts: bool = False
    input_flags: tuple[InputFlag, ...] = ()
    output_shapes: Mapping[str, tuple[OutputShape, ...]] | None = None

    def __post_init__(self) -> None:
        """Freezes ``output_shapes`` and checks that each rule names ports its op has."""
        if self.output_shapes is None:
            return
        object.__setattr__(self, "output_shapes", types.MappingProxyType(dict(self.output_shapes)))
        by_name = {op.name: op for op in self.ops}
        for op_name, rules in self.output_shapes.items():
            op = by_name.get(op_name)
            if op is None:
                raise ValueError(f"family {self.name}: output_shapes names op {op_name!r}, not one of {list(by_name)}")
            inputs = {port.name for port in op.inputs}
            outputs = {port.name for port in op.outputs}
            for rule in rules:
                named = {rule.like, *(axis.input for axis in rule.axes or ())}
                if rule.output not in outputs or not named <= inputs:
                    raise ValueError(
                        f"family {self.name}: {op_name} rule {rule} names a port {op_name} does not have; "
                        f"inputs {sorted(inputs)}, outputs {sorted(outputs)}"
                    )

    def shapes_of(self, op: OpSpec) -> tuple[OutputShape, ...]:
        """Returns the output-shape rules of ``op`` (empty where the family gives it none)."""
        return () if self.output_shapes is None else self.output_shapes.get(op.name, ())
