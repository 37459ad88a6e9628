"""CTCLoss and CTCLossGrad: torch's ctc_loss pair as ops. Part of the op contract (``ops/schema.py``)."""

from __future__ import annotations

import dataclasses

from ortlstm.ops.contract import DOMAIN, OPSET_VERSION, AttrSpec, AttrType, OpSpec, PortSpec, TypeConstraintSpec
from ortlstm.ops.family import AxisOf, Family, InputFlag, OutputShape

# ---- CTC ops ------------------------------------------------------------------------------------
# torch.nn.functional.ctc_loss's native pair (_ctc_loss, _ctc_loss_backward) as ops of the domain.
# Not LSTM ops: their ports have their own dims (shape_doc), named as in torch's docs: T (max_time,
# log_probs' first axis), N (batch), C (classes, blank included), S (padded targets' second axis, or
# the largest target length for concatenated targets). Reductions stay in the graph (standard ops).

_CTC_FLOAT = TypeConstraintSpec(
    type_str="T",
    allowed_types=("tensor(float)", "tensor(double)"),
    doc="log_probs, the losses, log_alpha and the gradients share one type: float32, or float64 for gradient checks.",
)
_CTC_TARGETS = TypeConstraintSpec(
    type_str="T1",
    allowed_types=("tensor(int32)", "tensor(int64)"),
    doc="Target labels, int32 or int64 as torch takes them.",
)
_CTC_LENGTHS = TypeConstraintSpec(
    type_str="T2",
    allowed_types=("tensor(int32)", "tensor(int64)"),
    doc="input_lengths and target_lengths, int32 or int64 (both the same).",
)


def _ctc_port(name: str, doc: str, shape: str, type_str: str, *, differentiable: bool = False) -> PortSpec:
    return PortSpec(
        name=name,
        doc=doc,
        shape=(),
        type_str=type_str,
        optional=False,
        differentiable=differentiable,
        shape_doc=shape,
    )


_CTC_SHARED_INPUTS = (
    _ctc_port(
        "log_probs",
        "Log-probabilities of every class at every step (e.g. a log_softmax over C), time-major as torch's.",
        "[T, N, C]",
        "T",
        differentiable=True,
    ),
    _ctc_port(
        "targets",
        "Label sequences: padded [N, S] (sample n's labels in its first target_lengths[n] entries) or all of them "
        "concatenated, [sum(target_lengths)]. Labels lie in [0, C) and differ from blank.",
        "[N, S] or [sum(target_lengths)]",
        "T1",
    ),
    _ctc_port("input_lengths", "Valid steps of each sample's log_probs, each in [0, T].", "[N]", "T2"),
    _ctc_port(
        "target_lengths",
        "Length of each sample's target, each >= 0 (and <= S for padded targets).",
        "[N]",
        "T2",
    ),
)

_CTC_ATTRIBUTES = (
    AttrSpec(
        name="blank",
        type=AttrType.INT,
        default=0,
        required=False,
        doc="The blank label, as torch's `blank`.",
        accepts="an integer >= 0 (and < C, checked when run)",
    ),
    AttrSpec(
        name="zero_infinity",
        type=AttrType.INT,
        default=0,
        required=False,
        doc=(
            "1: an infinite loss (no alignment of the target fits in the input, e.g. a target longer than the "
            "input) becomes 0, and so does its gradient, as torch's `zero_infinity=True`."
        ),
        accepts="0 or 1",
    ),
)

_CTC_REFUSALS = (
    "When run, before any work: log_probs of a rank other than 3; targets of a rank other than 1 or 2; "
    "input_lengths or target_lengths of another shape than [N]; padded targets with a first axis other than N, or "
    "concatenated targets with another length than sum(target_lengths); a length below 0, an input length above "
    "T, a target length above S (padded targets); a label (within a sample's target length) outside [0, C) or "
    "equal to blank; blank >= C; integer inputs of a type other than int32 or int64. Each message names the input, "
    "the sample and the expected and actual values.",
)

CTC_LOSS = OpSpec(
    name="CTCLoss",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
Connectionist temporal classification loss of each sample: torch.nn.functional.ctc_loss with
reduction='none' (torch's `_ctc_loss`), and the forward variables `CTCLossGrad` needs.

For sample n with input length L = input_lengths[n] and target l of length U = target_lengths[n],
the extended target l' = (blank, l_1, blank, l_2, ..., l_U, blank) has 2U+1 states, and in log space
(Graves et al. 2006, eqs. 6-8):

    log_alpha[n, 0, 0] = log_probs[0, n, blank],  log_alpha[n, 0, 1] = log_probs[0, n, l_1]
    log_alpha[n, t, s] = logsumexp(log_alpha[n, t-1, s], log_alpha[n, t-1, s-1],
                                   log_alpha[n, t-1, s-2] if l'_s != l'_{s-2}) + log_probs[t, n, l'_s]
    loss[n] = -logsumexp(log_alpha[n, L-1, 2U], log_alpha[n, L-1, 2U-1])

(only log_alpha[n, L-1, 0] when U = 0; with L = 0 the loss is 0 for U = 0, else +inf). Every sum
is a logsumexp with the maximum taken out, so nothing underflows however long the input.
log_alpha is -inf wherever the recursion does not reach (t >= L, s > 2U). `reduction='mean'` is
`ReduceMean(loss / Max(target_lengths, 1))` and `'sum'` is `ReduceSum(loss)` in the graph.
Samples are split over the session's intra-op threads; the result does not depend on how.""",
    inputs=_CTC_SHARED_INPUTS,
    outputs=(
        _ctc_port(
            "loss",
            "Negative log-likelihood of each sample's target; +inf when no alignment fits (0 with zero_infinity).",
            "[N]",
            "T",
            differentiable=True,
        ),
        dataclasses.replace(
            _ctc_port(
                "log_alpha",
                "The forward variables, stash for CTCLossGrad; -inf where unreached. S is targets' second axis "
                "(padded) or max(target_lengths) (concatenated), as torch's.",
                "[N, T, 2*S+1]",
                "T",
            ),
            optional=True,
        ),
    ),
    attributes=_CTC_ATTRIBUTES,
    type_constraints=(_CTC_FLOAT, _CTC_TARGETS, _CTC_LENGTHS),
    refusals=_CTC_REFUSALS,
)

CTC_LOSS_GRAD = OpSpec(
    name="CTCLossGrad",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
Gradient of `CTCLoss`'s loss with respect to log_probs, as torch's `_ctc_loss_backward` computes it.

With log_beta the backward variables (eqs. 10-11 of Graves et al.) and, for step t < L and class c,
`collected[t, c] = logsumexp over the states s with l'_s = c of log_alpha[n, t, s] + log_beta[n, t, s]`:

    grad_log_probs[t, n, c] = (exp(log_probs[t, n, c]) - exp(collected[t, c] + loss[n] - log_probs[t, n, c]))
                              * grad_loss[n]

and 0 for t >= L. This is torch's convention: the derivative of the loss with respect to log_probs
plus exp(log_probs) * grad_loss. A normalization over C in front (log_softmax, or Log of a softmax)
cancels that term exactly, so the gradient at its input is the true one; fed log_probs that are not
normalized, the gradient is torch's, not the derivative. With zero_infinity an infinite loss gets a
zero gradient (known from log_alpha, as loss holds 0 there); without it, its gradient is NaN, as
torch's. Attributes must equal the forward node's. No port is differentiable: second-order
gradients are not provided.""",
    inputs=(
        dataclasses.replace(
            _ctc_port("grad_loss", "Gradient of the objective with respect to each sample's loss.", "[N]", "T"),
            gradient_of="loss",
        ),
        *(dataclasses.replace(port, differentiable=False) for port in _CTC_SHARED_INPUTS),
        _ctc_port("loss", "The forward node's loss output.", "[N]", "T"),
        _ctc_port("log_alpha", "The forward node's log_alpha output.", "[N, T, 2*S+1]", "T"),
    ),
    outputs=(
        dataclasses.replace(
            _ctc_port(
                "grad_log_probs", "Gradient with respect to log_probs (torch's convention, above).", "[T, N, C]", "T"
            ),
            gradient_of="log_probs",
        ),
    ),
    attributes=_CTC_ATTRIBUTES,
    type_constraints=(_CTC_FLOAT, _CTC_TARGETS, _CTC_LENGTHS),
    refusals=(
        *_CTC_REFUSALS,
        "When run: grad_loss or loss of another shape than [N]; log_alpha of another shape than [N, T, 2*S+1].",
    ),
)

CTC_OPS: tuple[OpSpec, ...] = (CTC_LOSS, CTC_LOSS_GRAD)
"""The CTC loss and its gradient: ops with their own dims and attributes, like the optimizer ops."""



_LOG_PROBS_RANK = 3  # [T, N, C]: the shapes below are known only at that rank
CTC_FAMILY = Family(
    name="CTC",
    ops=CTC_OPS,
    doc_label="the CTC loss",
    input_flags=(InputFlag("IsInteger", ("tensor(int32)", "tensor(int64)")),),
    output_shapes={
        CTC_LOSS.name: (
            OutputShape("loss", "log_probs", (AxisOf("log_probs", 1),), rank=_LOG_PROBS_RANK),
            # [N, T, 2*S+1]; S is padded targets' [N, S] second axis (for concatenated targets it is a
            # value, max(target_lengths), so that axis stays unknown).
            OutputShape(
                "log_alpha",
                "log_probs",
                (AxisOf("log_probs", 1), AxisOf("log_probs", 0), AxisOf("targets", 1, rank=2, factor=2, offset=1)),
                rank=_LOG_PROBS_RANK,
            ),
        ),
        CTC_LOSS_GRAD.name: (OutputShape("grad_log_probs", "log_probs", rank=_LOG_PROBS_RANK),),
    },
)
"""The CTC ops: their attributes are their own; the integer inputs take int32 or int64."""
