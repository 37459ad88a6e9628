"""Gradient rule of Einsum (ai.onnx): explicit and implicit output, ellipsis, diagonals, summed indices, broadcasting.

For ``Y = einsum(A_1, ..., A_n)`` the gradient of operand i is an Einsum of dY with the other
operands, ``G = einsum(dY, A_j (j != i) -> letters of A_i)``: every product term that reached Y
through ``A_i[idx]`` is summed back there. Three things an Einsum output cannot say are added after it:

- a letter that occurs only in A_i (summed away by the forward, e.g. j in ``ij->i``) meets no other
  operand: G is computed without it and broadcast along it (Expand to A_i's shape);
- a letter repeated in A_i (a diagonal, ``ii->i``) appears once in G: the repeats become size-1 axes
  and a Kronecker delta (an identity ``[n, n]`` per repeat, EyeLike where n is known at run time only)
  puts G on the diagonal and zeros elsewhere;
- ellipsis dims that broadcast (size 1 in A_i, larger in another operand) are summed down to A_i's
  shape, as for Add.

The ellipsis is spelled out as letters the equation does not use (the operands' ranks must be
known); the implicit output is ONNX's: the ellipsis dims, then the letters that occur once, in
alphabetical order. Protos only.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import numpy as np

from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule


def _terms(ctx: GradientContext) -> tuple[list[str], str]:
    """The operands' and the output's letters with the ellipsis spelled out as unused letters."""
    equation = str(ctx.attribute("equation", "")).replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ctx.node.input):
        raise ctx.fail(f"equation {equation!r} has {len(terms)} operands, the node {len(ctx.node.input)} inputs")
    unused = [letter for letter in string.ascii_letters if letter not in equation]
    widths = []
    for index, term in enumerate(terms):
        if "..." not in term:
            widths.append(0)
            continue
        rank = ctx.emitter.rank(ctx.input(index))
        if rank is None:
            raise ctx.fail(
                f"equation {equation!r}: the rank of input {index} ({ctx.input(index)!r}) is unknown, and the "
                "ellipsis needs it; run onnx shape inference or give the model's inputs shapes"
            )
        widths.append(rank - (len(term) - 3))
    ellipsis = "".join(unused[: max(widths, default=0)])

    def spell(term: str, width: int) -> str:
        return term.replace("...", ellipsis[len(ellipsis) - width :] if width else "")

    spelled = [spell(term, width) for term, width in zip(terms, widths, strict=True)]
    if arrow:
        output = spell(rhs, len(ellipsis))
    else:
        letters = "".join(spelled)
        output = ellipsis + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ellipsis))
    return spelled, output


def _diagonal_mask(ctx: GradientContext, operand: str, rank: int, first: int, repeat: int) -> str:
    """A delta over axes ``first`` and ``repeat`` of ``operand`` (identity there, size 1 elsewhere), its type."""
    e = ctx.emitter
    shape = e.static_shape(operand)
    others = [axis for axis in range(rank) if axis not in (first, repeat)]
    if shape is not None and e.elem_type(operand):
        eye = e.constant(np.eye(shape[first]), e.elem_type(operand), name="einsum_diagonal")
    else:
        size = ctx.op("Slice", [e.shape(operand), e.ints([first]), e.ints([first + 1])])
        square = ctx.op("ConstantOfShape", [ctx.op("Concat", [size, size], axis=0)])
        eye = ctx.op("CastLike", [ctx.op("EyeLike", [square]), operand])
    return e.unsqueeze(eye, others) if others else eye


def _operand_grad(ctx: GradientContext, dy: str, terms: list[str], output: str, index: int, *, ellipsis: bool) -> str:
    """dA_i: an Einsum of dY and the other operands, then broadcast, diagonal and unbroadcast steps."""
    e = ctx.emitter
    term, operand = terms[index], ctx.input(index)
    others = [j for j in range(len(terms)) if j != index]
    elsewhere = set(output).union(*(terms[j] for j in others))
    unique = "".join(dict.fromkeys(term))  # first occurrences, in order
    kept = "".join(letter for letter in unique if letter in elsewhere)
    equation = ",".join([output, *(terms[j] for j in others)]) + "->" + kept
    grad = ctx.op("Einsum", [dy, *(ctx.input(j) for j in others)], equation=equation)
    # Size-1 axes for the letters only A_i has, in unique order, then for each repeat of a letter.
    missing = [axis for axis, letter in enumerate(unique) if letter not in elsewhere]
    if missing:
        grad = e.unsqueeze(grad, missing)
    repeats = [axis for axis, letter in enumerate(term) if term.index(letter) != axis]
    if repeats:
        grad = e.unsqueeze(grad, repeats)
    if missing:
        grad = ctx.op("Expand", [grad, e.shape(operand)])
    for axis in repeats:
        mask = _diagonal_mask(ctx, operand, len(term), term.index(term[axis]), axis)
        grad = ctx.op("Mul", [grad, mask])
    # Only ellipsis dims broadcast in ONNX's Einsum; lettered dims match.
    return e.unbroadcast(grad, operand) if ellipsis else grad


@register_gradient_rule("", "Einsum")
def einsum_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dA_i = einsum(dY, A_j for j != i -> A_i's letters), spread along A_i's own summed letters and diagonals."""
    (dy,) = grad_outputs
    assert dy is not None
    terms, output = _terms(ctx)
    ellipsis = "..." in str(ctx.attribute("equation", ""))
    return [
        _operand_grad(ctx, dy, terms, output, index, ellipsis=ellipsis) if ctx.needs(index) else None
        for index in range(len(terms))
    ]
