"""torch's CPU arithmetic in standard ONNX ops: the per-update scalars in float64, the tensor ops rounded as torch's.

Two halves. The scalar helpers compute what torch computes in Python floats (learning rates,
bias corrections) as 0-D float64 values and round them once to the parameters' type where torch
hands them to a tensor op. ``TensorMath`` writes torch's in-place tensor ops on the values of one
parameter (``add_(alpha=)``, ``lerp_``, ``addcmul_``, ``addcdiv_``) in their CPU kernels' order of
operations, a multiply-add rounded once where those kernels fuse it; an optimizer's standard-ops
update gets one, made once per parameter, so it reads line by line as torch's single-tensor code.
Protos only: nothing here runs a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper

from ortlstm.graphs.emit.emitter import GraphEmitter

DOUBLE = onnx.TensorProto.DOUBLE


# ---- scalars (torch's Python floats) -----------------------------------------------------------


def scalar_double(emitter: GraphEmitter, value: str) -> str:
    """A 0-D float64 copy of a 0-D or one-element input."""
    return emitter.op("Reshape", [emitter.op("Cast", [value], to=DOUBLE), emitter.ints([])])


def as_double(emitter: GraphEmitter, value: str) -> str:
    """``value`` as float64: itself when it is, else a Cast (its shape kept)."""
    return value if emitter.elem_type(value) == DOUBLE else emitter.op("Cast", [value], to=DOUBLE)


def group_lr(emitter: GraphEmitter, lr: str, lr_scale: float) -> str:
    """The group's learning rate, 0-D float64 (torch's Python float)."""
    lr_d = scalar_double(emitter, lr)
    return lr_d if lr_scale == 1.0 else emitter.op("Mul", [lr_d, emitter.constant(lr_scale, DOUBLE)])


def node_scalars(emitter: GraphEmitter, lr: str, step: str, lr_scale: float) -> dict[str, str]:
    """What an ortlstm optimizer node reads of the graph: the group's lr and the step, as float64."""
    lr_d = as_double(emitter, lr)
    if lr_scale != 1.0:
        lr_d = emitter.op("Mul", [lr_d, emitter.constant(lr_scale, DOUBLE)])
    return {"lr": lr_d, "step": as_double(emitter, step)}


def cast_to(emitter: GraphEmitter, value: str, elem_type: int) -> str:
    """A float64 ``value`` rounded to ``elem_type`` (itself for float64)."""
    return value if elem_type == DOUBLE else emitter.op("Cast", [value], to=elem_type)


def decoupled_decay(emitter: GraphEmitter, lr: str, weight_decay: float, elem_type: int) -> str:
    """The factor of torch's ``param.mul_(1 - lr * weight_decay)``: a Python float rounded to the parameters' type."""
    one = emitter.constant(1.0, DOUBLE)
    decay = emitter.op("Sub", [one, emitter.op("Mul", [lr, emitter.constant(weight_decay, DOUBLE)])])
    return cast_to(emitter, decay, elem_type)


def np_dtype(elem_type: int) -> np.dtype:
    """The NumPy dtype of an ONNX element type."""
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def param_elem_type(emitter: GraphEmitter, param: str) -> int:
    """The element type of a parameter, which the emitter must know.

    Raises:
        ValueError: The emitter does not know it.
    """
    elem_type = emitter.elem_type(param)
    if not elem_type:
        raise ValueError(
            f"the element type of parameter {param!r} is unknown to the emitter; record it with "
            "emitter.set_type (or build the emitter with infer_value_types(model))"
        )
    return elem_type


# ---- tensors (torch's CPU kernels) -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TensorMath:
    """torch's CPU tensor ops on values of one element type, emitted as standard ONNX ops.

    Attributes:
        emitter: Receives the nodes.
        elem_type: ONNX element type of the tensors (the parameter's).
        fused: Round ``a * b + c`` once where torch's CPU kernels fuse it (``Optimizer.fused_multiply_add``).
    """

    emitter: GraphEmitter
    elem_type: int
    fused: bool

    def op(self, op_type: str, inputs: Sequence[str], **attributes: Any) -> str:
        """One node (``GraphEmitter.op``)."""
        return self.emitter.op(op_type, inputs, **attributes)

    def const(self, value: float) -> str:
        """A 0-D constant: ``value`` (a Python float, i.e. double) rounded to the element type once."""
        return self.emitter.constant(
            np.asarray(value, dtype=np.float64).astype(np_dtype(self.elem_type)), self.elem_type
        )

    def wide(self, value: str | float) -> str:
        """``value`` (a tensor of the element type or a Python float rounded to it) as float64, exactly."""
        if isinstance(value, str):
            return self.emitter.op("Cast", [value], to=DOUBLE)
        rounded = np.asarray(value, dtype=np.float64).astype(np_dtype(self.elem_type)).astype(np.float64)
        return self.emitter.constant(rounded, DOUBLE)

    def fma(self, a: str, b: str | float, c: str, *, name: str | None = None) -> str:
        """``a * b + c``, rounded once when ``fused`` (a fused multiply-add, as torch's CPU kernels do).

        ONNX has no FMA op. For float32 (and 16-bit) values the product of two is exact in float64, so
        computing there and rounding back gives the fused result (a double rounding could differ in
        about one case in 2**29). float64 values are multiplied and added with two roundings.
        ``b`` may be a Python float, rounded to the element type first as torch rounds a scalar argument.
        """
        emitter = self.emitter
        outputs = 1 if name is None else [emitter.fresh(name)]
        if self.fused and self.elem_type != DOUBLE:
            wide = emitter.op("Add", [emitter.op("Mul", [self.wide(a), self.wide(b)]), self.wide(c)])
            return emitter.op("Cast", [wide], to=self.elem_type, outputs=outputs)
        factor = b if isinstance(b, str) else self.const(b)
        return emitter.op("Add", [emitter.op("Mul", [a, factor]), c], outputs=outputs)

    def l2_gradient(self, param: str, grad: str, maximize: bool, weight_decay: float) -> str:
        """The gradient as torch's first lines make it: ``-grad`` if maximize, then ``+ weight_decay * param``."""
        g = self.emitter.op("Neg", [grad]) if maximize else grad
        return g if weight_decay == 0 else self.fma(param, weight_decay, g)

    def weight_decay(
        self, param: str, grad: str, maximize: bool, weight_decay: float, decay: str | None = None
    ) -> tuple[str, str]:
        """The first lines of torch's update: ``-grad`` if maximize, then the decay, decoupled or through the gradient.

        Args:
            param: The parameter.
            grad: Its gradient.
            maximize: Negate the gradient.
            weight_decay: The L2 penalty added to the gradient (``grad + weight_decay * param``)
                when there is no ``decay``.
            decay: The decoupled decay's factor (``decoupled_decay``): the parameter is
                multiplied by it instead, or None.

        Returns:
            The parameter and the gradient the update goes on with.
        """
        if decay is None:
            return param, self.l2_gradient(param, grad, maximize, weight_decay)
        g = self.emitter.op("Neg", [grad]) if maximize else grad
        return self.emitter.op("Mul", [param, decay]), g  # param.mul_(1 - lr * weight_decay)

    def lerp(self, start: str, end: str, weight: float, *, name: str) -> str:
        """The lerp of torch's ``start.lerp_(end, weight)``, the weight rounded to the tensor's type.

        ``start + w * (end - start)`` for ``|w| < 0.5``, else ``end + (w - 1) * (end - start)``.
        """
        rounded = np.asarray(weight, dtype=np.float64).astype(np_dtype(self.elem_type))
        diff = self.emitter.op("Sub", [end, start])
        if abs(float(rounded)) < 0.5:
            return self.fma(diff, float(rounded), start, name=name)
        return self.fma(diff, float(rounded - rounded.dtype.type(1)), end, name=name)

    def decayed_square(self, average: str, g: str, decay: float, *, name: str) -> str:
        """The average of ``average.mul_(decay).addcmul_(g, g, value=1 - decay)``, torch's order.

        ``((1 - decay) * g) * g + average * decay``, the multiply-add fused as torch's CPU kernel fuses it.
        """
        scaled = self.emitter.op("Mul", [average, self.const(decay)])
        weighted = self.emitter.op("Mul", [g, self.const(1.0 - decay)])
        return self.fma(weighted, g, scaled, name=name)

    def addcdiv(self, base: str, numerator: str, denominator: str, *, name: str) -> str:
        """The result of torch's CPU ``base.addcdiv_(numerator, denominator)``, the value folded into ``numerator``.

        ``base + numerator / denominator``, each operation rounded.
        """
        emitter = self.emitter
        return emitter.op("Add", [base, emitter.op("Div", [numerator, denominator])], outputs=[emitter.fresh(name)])
