"""The only table of gradient rules, keyed by (domain, op_type), and what a rule is handed.

A rule differentiates one forward node: it gets a ``GradientContext`` (the node, the emitter,
which inputs need a gradient) and the gradients of the node's outputs (None where none reaches
the loss), emits standard ONNX nodes and returns one gradient per input (None where none is
needed or the input is not differentiable). Rules are found by lookup, never imported by name:
adding an op is one rule plus one row in the finite-difference table (tests/test_autodiff_rules.py).

Which inputs are differentiable comes from the op schemas: ``onnx.defs`` for ai.onnx
(``differentiation_category``), ``ops/schema.py`` for ortlstm, and the registration of a user's
own rule otherwise. A registration may narrow that further (e.g. BatchNormalization's running
statistics are not parameters).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar, overload

import numpy as np
import onnx
import onnx.defs
import onnx.helper

from ortlstm.graphs.emit.emitter import FLOAT_TYPES, GraphEmitter
from ortlstm.ops import schema as ortlstm_schema

ONNX_DOMAINS = ("", "ai.onnx")


class GradientContext:
    """What a rule sees of the forward node it differentiates.

    Attributes:
        node: The forward node (read-only for rules; use ``require_output`` to name an output).
        emitter: Where the rule's nodes go (``ctx.emitter.op(...)``, ``ctx.emitter.constant(...)``).
        opset: The model's ai.onnx opset.
    """

    def __init__(self, node: onnx.NodeProto, emitter: GraphEmitter, needs: Sequence[bool]) -> None:
        self.node = node
        self.emitter = emitter
        self.opset = emitter.opset
        self._needs = list(needs)
        self._attributes = {attribute.name: attribute for attribute in node.attribute}

    # ---- the node ----------------------------------------------------------------------------

    def needs(self, index: int) -> bool:
        """Whether the gradient of input ``index`` is wanted (it lies on a parameter -> loss path)."""
        return index < len(self._needs) and self._needs[index]

    def input(self, index: int) -> str:
        """Name of input ``index``; "" when the node omits it."""
        return self.node.input[index] if index < len(self.node.input) else ""

    def output(self, index: int) -> str:
        """Name of output ``index``; "" when the node omits it (see ``require_output``)."""
        return self.node.output[index] if index < len(self.node.output) else ""

    def constant_input(self, index: int) -> np.ndarray | None:
        """The value of input ``index`` when it is a constant the emitter knows (integer bounds, axes), else None."""
        name = self.input(index)
        return self.emitter.constant_value(name) if name else None

    def has_attribute(self, name: str) -> bool:
        """Whether the node carries attribute ``name``."""
        return name in self._attributes

    def attribute(self, name: str, default: object = None) -> object:
        """The value of attribute ``name`` (bytes decoded to str), or ``default``."""
        if name not in self._attributes:
            return default
        value = onnx.helper.get_attribute_value(self._attributes[name])
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, list) and value and isinstance(value[0], bytes):
            return [item.decode() for item in value]
        return value

    def require_output(self, index: int) -> str:
        """Names output ``index`` of the forward node if it is unnamed (e.g. Dropout's mask) and returns it.

        The forward node is changed in place: the rule needs a value the forward pass computes
        anyway, and asking the forward node for it is cheaper than recomputing it.
        """
        while len(self.node.output) <= index:
            self.node.output.append("")
        if not self.node.output[index]:
            self.node.output[index] = self.emitter.fresh(f"{self.node.name or self.node.op_type}_output{index}")
        return self.node.output[index]

    def fail(self, message: str) -> ValueError:
        """A ValueError naming this node, for a rule that refuses a configuration."""
        return ValueError(f"{self.node.op_type} node {self.node.name!r}: {message}")

    # ---- shortcuts to the emitter ------------------------------------------------------------

    def op(self, op_type: str, inputs: Sequence[str | None], **kwargs: object) -> str:
        """``emitter.op`` with the node name derived from the forward node's."""
        kwargs.setdefault("name", f"{self.node.name or self.node.op_type}_grad/{op_type}")
        return self.emitter.op(op_type, inputs, **kwargs)  # type: ignore[arg-type]

    def scalar(self, value: float, like: str) -> str:
        """A 0-D constant in ``like``'s element type."""
        return self.emitter.scalar_like(value, like)


GradientRule = Callable[[GradientContext, Sequence["str | None"]], Sequence["str | None"]]
"""``rule(ctx, grad_outputs) -> grad_inputs``: one entry per node output in, one per node input out."""


@dataclasses.dataclass(frozen=True)
class RuleEntry:
    """A registered rule and the inputs it may differentiate.

    Attributes:
        rule: The gradient function.
        differentiable: Input indices that can carry a gradient, or None to take them from the
            op's schema (every input of a float type that the schema does not mark non-differentiable).
            An index past the end covers a variadic input list (``range`` objects are open-ended).
    """

    rule: GradientRule
    differentiable: Callable[[int], bool] | None = None


_RULES: dict[tuple[str, str], RuleEntry] = {}


def _domain_key(domain: str) -> str:
    return "" if domain in ONNX_DOMAINS else domain


# A rule keeps its own signature through the decorator (the overloads say which form returns what).
_Rule = TypeVar("_Rule", bound=GradientRule)


@overload
def register_gradient_rule(
    domain: str,
    op_type: str,
    rule: None = None,
    *,
    differentiable: Sequence[int] | Callable[[int], bool] | None = None,
    replace: bool = False,
) -> Callable[[_Rule], _Rule]: ...


@overload
def register_gradient_rule(
    domain: str,
    op_type: str,
    rule: _Rule,
    *,
    differentiable: Sequence[int] | Callable[[int], bool] | None = None,
    replace: bool = False,
) -> _Rule: ...


def register_gradient_rule(
    domain: str,
    op_type: str,
    rule: GradientRule | None = None,
    *,
    differentiable: Sequence[int] | Callable[[int], bool] | None = None,
    replace: bool = False,
) -> Callable[[_Rule], _Rule] | GradientRule:
    """Registers the gradient rule of (domain, op_type); usable as a decorator.

    A user's own op gets a gradient this way, e.g.::

        @register_gradient_rule("my.domain", "Scale")
        def _scale_grad(ctx, grad_outputs):
            (dy,) = grad_outputs
            return [ctx.op("Mul", [dy, ctx.input(1)]), None]

    Args:
        domain: The op's domain ("" or "ai.onnx" for standard ops).
        op_type: The op type.
        rule: The rule; omit it to use the function as a decorator.
        differentiable: Input indices that may carry a gradient, or a predicate on the index.
            Default: from the op's schema (ai.onnx, ortlstm); every float input for other domains.
        replace: Allow replacing an existing rule (otherwise registering twice is an error).

    Raises:
        ValueError: A rule is already registered for (domain, op_type) and ``replace`` is False.
    """
    if differentiable is None or callable(differentiable):
        predicate = differentiable
    else:
        allowed = frozenset(differentiable)

        def predicate(index: int) -> bool:
            return index in allowed

    def register(function: _Rule) -> _Rule:
        key = (_domain_key(domain), op_type)
        if key in _RULES and not replace:
            raise ValueError(f"a gradient rule for {domain or 'ai.onnx'}::{op_type} is already registered")
        _RULES[key] = RuleEntry(function, predicate)
        return function

    return register if rule is None else register(rule)


def gradient_rule(domain: str, op_type: str) -> RuleEntry | None:
    """The registered rule of (domain, op_type), or None."""
    return _RULES.get((_domain_key(domain), op_type))


_MISSING_RULE_HINTS: dict[tuple[str, str], str] = {}


def register_missing_rule_hint(domain: str, op_type: str, hint: str) -> None:
    """Says what to do instead when (domain, op_type), which has no rule, lies on a parameter -> loss path.

    The hint replaces the generic advice (freeze the parameter or register a rule) in the error,
    e.g. for ai.onnx LSTM: convert the model to LSTMTraining first.
    """
    _MISSING_RULE_HINTS[(_domain_key(domain), op_type)] = hint


def missing_rule_hint(domain: str, op_type: str) -> str | None:
    """The hint registered for (domain, op_type), or None."""
    return _MISSING_RULE_HINTS.get((_domain_key(domain), op_type))


for _control_flow in ("If", "Loop", "Scan"):
    register_missing_rule_hint(
        "",
        _control_flow,
        "Control flow is not differentiated: fix the inputs that decide it for training "
        "(build_training_models(..., fixed_inputs={name: value}) replaces an If by the branch chosen; "
        "fixed_shapes={name: dims} does the same for conditions on input shapes), "
        "or freeze the parameters its subgraphs read.",
    )


def registered_ops() -> list[tuple[str, str]]:
    """Every (domain, op_type) with a rule, sorted (for docs and tests)."""
    return sorted(_RULES)


def _schema_says_differentiable(node: onnx.NodeProto, index: int, opset: int) -> bool:
    domain = _domain_key(node.domain)
    if domain == ortlstm_schema.DOMAIN:
        try:
            op = ortlstm_schema.op_by_name(node.op_type)
        except KeyError:
            return True
        return index < len(op.inputs) and op.inputs[index].differentiable
    if domain == "":
        try:
            op_schema = onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            return True
        formal = op_schema.inputs
        if not formal:
            return False
        parameter = formal[min(index, len(formal) - 1)]
        if index >= len(formal) and parameter.option != onnx.defs.OpSchema.FormalParameterOption.Variadic:
            return False
        return parameter.differentiation_category != onnx.defs.OpSchema.DifferentiationCategory.NonDifferentiable
    return True


def input_is_differentiable(node: onnx.NodeProto, index: int, emitter: GraphEmitter) -> bool:
    """Whether input ``index`` of ``node`` can carry a gradient.

    It must be present, of a float type when its type is known, allowed by the rule's
    registration when it narrows the inputs, and not marked non-differentiable by the schema.
    """
    if index >= len(node.input) or not node.input[index]:
        return False
    elem_type = emitter.elem_type(node.input[index])
    if elem_type and elem_type not in FLOAT_TYPES:
        return False
    entry = gradient_rule(node.domain, node.op_type)
    if entry is not None and entry.differentiable is not None:
        return entry.differentiable(index)
    return _schema_says_differentiable(node, index, emitter.opset)
