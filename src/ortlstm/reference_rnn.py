"""A NumPy float64 reference of RNNTraining and RNNGrad, written from the equations in docs/ops.md.

An oracle for the kernel tests that shares no code with the kernels: the forward of ONNX RNN with
every attribute the op takes (directions, sequence_lens, clip, all activations with alpha/beta,
layout 1) and its backward with f' read off HAll (``rnn_grad``), as RNNGrad reads it.
``ortlstm.reference.OPS`` runs both through onnx's ReferenceEvaluator (``rnn_training_op`` /
``rnn_grad_op``: inputs checked against the spec, outputs in X's float type).

RNNGrad, per direction and step, with ``dH`` the gradient reaching H_t (grad_HAll_t plus what the
step processed after it sends back, starting from grad_Ht)::

    da = dH * f'(H_t),  dH_{t-1} = da R,  dX_t = da W,  dW += da^T X_t,  dR += da^T H_{t-1},
    dWb = dRb += sum_batch da

Attributes are parsed by ``ortlstm.reference.parse_attributes`` (the LSTM's rules, which the RNN
shares), so the ops read activations, alpha, beta and clip alike.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from ortlstm import reference as _reference
from ortlstm.ops import schema
from ortlstm.reference import parse_attributes
from ortlstm.reference_gru import _gate
from ortlstm.reference_precision import matmul

_Array = np.ndarray


def _rnn_activations(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes with each direction's f padded to the LSTM's (f, g, h), for parse_attributes.

    ONNX RNN's default is Tanh (the LSTM's parser would give Sigmoid); the padding is Tanh, which
    reads no alpha or beta, so the alpha/beta cursors advance as for the RNN.
    """
    values = {name: value for name, value in attributes.items() if value is not None}
    num_directions = schema.num_directions(values.get("direction", "forward"))
    names = values.pop("activations", None) or values.pop("activations_csv", None)
    values.pop("activations_csv", None)
    if isinstance(names, str):
        names = names.split(",")
    names = [name.decode() if isinstance(name, bytes) else str(name) for name in names or ["Tanh"] * num_directions]
    if len(names) != num_directions:
        raise ValueError(
            f"attribute activations: expected 1*num_directions={num_directions} names (f per direction), "
            f"got {len(names)} [{', '.join(names)}]"
        )
    values["activations"] = [name for f in names for name in (f, "Tanh", "Tanh")]
    return values


def rnn_training(inputs: Mapping[str, _Array | None], **attributes: Any) -> dict[str, _Array]:
    """RNNTraining in float64: HAll and Ht from the spec's inputs (None: omitted).

    Args:
        inputs: X, W, R and the optional B, sequence_lens, initial_h, as the op takes them.
        **attributes: The node's attributes.

    Returns:
        HAll and Ht in the layout the attributes name.
    """
    attrs = parse_attributes(_rnn_activations(attributes))
    mm = functools.partial(matmul, attrs.matmul_precision)  # every GEMM, at the node's precision
    hidden, layout, directions = attrs.hidden_size, attrs.layout, attrs.num_directions
    X = _reference._to_layout0(inputs["X"], layout, 1)
    assert X is not None  # a required input
    steps, batch, _ = X.shape
    W = np.asarray(inputs["W"], np.float64)
    R = np.asarray(inputs["R"], np.float64)
    B = inputs.get("B")
    B = np.zeros((directions, 2 * hidden)) if B is None else np.asarray(B, np.float64)
    lens = inputs.get("sequence_lens")
    lens = np.full(batch, steps) if lens is None else np.asarray(lens)
    h0 = _reference._to_layout0(inputs.get("initial_h"), layout, 1)
    h0 = np.zeros((directions, batch, hidden)) if h0 is None else h0
    hall = np.zeros((steps, directions, batch, hidden))
    ht = np.zeros((directions, batch, hidden))
    for d in range(directions):
        f = attrs.activations[d][0]
        wb, rb = np.split(B[d], 2)
        order = range(steps - 1, -1, -1) if attrs.is_reverse(d) else range(steps)
        state = h0[d].copy()
        for t in order:
            active = (t < lens)[:, None]
            new = _gate(f, mm(X[t], W[d].T) + mm(state, R[d].T) + wb + rb, attrs.clip)
            state = np.where(active, new, state)
            hall[t, d] = np.where(active, new, 0.0)
        ran = (lens > 0) & (steps > 0)
        ht[d] = np.where(ran[:, None], state, 0.0)
    if layout == 1:
        return {"HAll": hall.transpose(2, 0, 1, 3), "Ht": ht.transpose(1, 0, 2)}
    return {"HAll": hall, "Ht": ht}


def rnn_grad(inputs: Mapping[str, _Array | None], **attributes: Any) -> dict[str, _Array]:
    """RNNGrad in float64: dX, dW, dR, dB, dH0 from the forward inputs, HAll and the upstream gradients.

    f' is read off HAll, as the kernel reads it, so an HAll from another implementation gives that
    implementation's gradients.

    Args:
        inputs: RNNGrad's inputs by port name (None or absent: omitted; omitted gradients count as zeros).
        **attributes: The forward node's attributes.

    Returns:
        Every output port name -> float64 array, in the layout the attributes name.
    """
    attrs = parse_attributes(_rnn_activations(attributes))
    mm = functools.partial(matmul, attrs.matmul_precision)  # every GEMM, at the node's precision
    hidden, layout, directions = attrs.hidden_size, attrs.layout, attrs.num_directions

    def layout0(name: str, batch_axis: int) -> _Array | None:
        return _reference._to_layout0(inputs.get(name), layout, batch_axis)

    X = layout0("X", 1)
    assert X is not None  # a required input
    steps, batch, _ = X.shape
    W = np.asarray(inputs["W"], np.float64)
    R = np.asarray(inputs["R"], np.float64)
    state_shape = (directions, batch, hidden)
    h0, grad_ht = (layout0(name, 1) for name in ("initial_h", "grad_Ht"))
    h0 = np.zeros(state_shape) if h0 is None else h0
    grad_ht = np.zeros(state_shape) if grad_ht is None else grad_ht
    hall, grad_hall = (layout0(name, 2) for name in ("HAll", "grad_HAll"))
    assert hall is not None  # a required input
    grad_hall = np.zeros((steps, directions, batch, hidden)) if grad_hall is None else grad_hall
    lens = inputs.get("sequence_lens")
    lens = np.full(batch, steps) if lens is None else np.asarray(lens, np.int64)
    dtype = np.asarray(inputs["X"]).dtype
    dX = np.zeros_like(X)
    dW, dR = np.zeros_like(W), np.zeros_like(R)
    dB = np.zeros((directions, 2 * hidden))
    dH0 = np.zeros(state_shape)
    for d in range(directions):
        f = attrs.activations[d][0]
        reverse = attrs.is_reverse(d)
        dH = np.where(((lens > 0) & (steps > 0))[:, None], grad_ht[d], 0.0)
        for t in range(steps) if reverse else range(steps - 1, -1, -1):  # processing order, reversed
            active = (t < lens)[:, None]
            before = t + 1 if reverse else t - 1
            has_before = ((before >= 0) & (before < lens))[:, None]
            h_prev = np.where(has_before, hall[min(max(before, 0), steps - 1), d], h0[d])
            da = (dH + grad_hall[t, d]) * _reference._gate_derivative(f, hall[t, d], attrs.clip, dtype)
            da = np.where(active, da, 0.0)
            dX[t] += mm(da, W[d])
            dW[d] += mm(da.T, X[t])
            dR[d] += mm(da.T, h_prev)
            dB[d] += np.tile(da.sum(axis=0), 2)
            dH = np.where(active, mm(da, R[d]), dH)  # an inactive step passes its state through unchanged
        dH0[d] = dH
    moved = {"dX": (dX, 1), "dH0": (dH0, 1)}
    result = {name: np.moveaxis(value, axis, 0) if layout == 1 else value for name, (value, axis) in moved.items()}
    return {**result, "dW": dW, "dR": dR, "dB": dB}


def rnn_training_op(inputs: Mapping[str, _Array | None], **attributes: Any) -> dict[str, _Array]:
    """RNNTraining as ``ortlstm.reference`` runs it: inputs checked as the kernel checks them, outputs in X's type."""
    attrs = parse_attributes(_rnn_activations(attributes))
    _, dtype = _reference._dims_and_dtype(schema.RNN_TRAINING, inputs, attrs)
    return {name: value.astype(dtype) for name, value in rnn_training(inputs, **attributes).items()}


def rnn_grad_op(inputs: Mapping[str, _Array | None], **attributes: Any) -> dict[str, _Array]:
    """RNNGrad as ``ortlstm.reference`` runs it: inputs and activations checked, outputs in X's type."""
    attrs = parse_attributes(_rnn_activations(attributes))
    _reference._check_grad_activations(attrs, schema.RNN_GRAD.name)
    _, dtype = _reference._dims_and_dtype(schema.RNN_GRAD, inputs, attrs)
    return {name: value.astype(dtype) for name, value in rnn_grad(inputs, **attributes).items()}
