"""A NumPy float64 reference of GRUTraining and GRUGrad, written from the equations in docs/ops.md.

An oracle for the kernel tests that shares no code with the kernels: the forward of ONNX GRU with
every attribute the op takes (linear_before_reset 0 and 1, directions, sequence_lens, clip, all
activations with alpha/beta, layout 1), the ZRH stash, and its backward from the stash alone
(``gru_grad``). ``ortlstm.reference.OPS`` runs both through onnx's ReferenceEvaluator
(``gru_training_op`` / ``gru_grad_op``: inputs checked against the spec, outputs in X's float type).

GRUGrad, per direction and step, with ``dH`` the gradient reaching H_t (grad_HAll_t plus what the
step processed after it sends back, starting from grad_Ht), q = H_{t-1} R_h^T + Rb_h::

    dz = dH * (H_{t-1} - h) * f'(z),   dh = dH * (1 - z) * g'(h)
    linear_before_reset=1: dr = dh * q * f'(r),               dq = dh * r
    linear_before_reset=0: dr = (dh R_h) * H_{t-1} * f'(r),   dR_h += dh^T (r * H_{t-1})
    dH_{t-1} = dH * z + dz R_z + dr R_r + (dq R_h  or  (dh R_h) * r)
    dX_t = [dz dr dh] W,  dW += [dz dr dh]^T X_t,  dR_zr += [dz dr]^T H_{t-1},  dR_h += dq^T H_{t-1} (lbr=1)
    dWb += sum_batch [dz dr dh],  dRb += sum_batch [dz dr dq] (lbr=1) or [dz dr dh] (lbr=0) Attributes are parsed by
``ortlstm.reference.parse_attributes`` (the LSTM's rules, which the GRU shares), so the two ops
read activations, alpha, beta and clip alike.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from ortlstm import reference as _reference
from ortlstm.ops import schema
from ortlstm.reference import Activation, parse_attributes
from ortlstm.reference_precision import matmul

_Array = np.ndarray


def _gru_activations(attributes: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """The attributes with each direction's (f, g) padded to the LSTM's (f, g, h), for parse_attributes.

    The padding is Tanh, which reads no alpha or beta, so the alpha/beta cursors advance as for the GRU.
    """
    values = {name: value for name, value in attributes.items() if value is not None}
    num_directions = schema.num_directions(values.get("direction", "forward"))
    names = values.pop("activations", None) or values.pop("activations_csv", None)
    values.pop("activations_csv", None)
    linear_before_reset = int(values.pop("linear_before_reset", 0))
    if isinstance(names, str):
        names = names.split(",")
    if names:
        names = [name.decode() if isinstance(name, bytes) else str(name) for name in names]
        if len(names) != 2 * num_directions:
            raise ValueError(
                f"attribute activations: expected 2*num_directions={2 * num_directions} names (f, g per direction), "
                f"got {len(names)} [{', '.join(names)}]"
            )
        values["activations"] = [name for d in range(num_directions) for name in (*names[2 * d : 2 * d + 2], "Tanh")]
    return values, linear_before_reset


def gru_training(inputs: Mapping[str, _Array | None], **attributes: Any) -> dict[str, _Array]:
    """GRUTraining in float64: HAll, Ht and ZRH from the spec's inputs (None: omitted).

    Args:
        inputs: X, W, R and the optional B, sequence_lens, initial_h, as the op takes them.
        **attributes: The node's attributes.

    Returns:
        HAll, Ht and ZRH in the layout the attributes name.
    """
    values, linear_before_reset = _gru_activations(attributes)
    attrs = parse_attributes(values)
    mm = functools.partial(matmul, attrs.matmul_precision)  # every GEMM, at the node's precision
    hidden = attrs.hidden_size
    layout = attrs.layout
    X = np.asarray(inputs["X"], np.float64)
    if layout == 1:
        X = X.transpose(1, 0, 2)
    steps, batch, _ = X.shape
    directions = attrs.num_directions
    W = np.asarray(inputs["W"], np.float64)
    R = np.asarray(inputs["R"], np.float64)
    B = inputs.get("B")
    B = np.zeros((directions, 6 * hidden)) if B is None else np.asarray(B, np.float64)
    lens = inputs.get("sequence_lens")
    lens = np.full(batch, steps) if lens is None else np.asarray(lens)
    h0 = inputs.get("initial_h")
    h0 = np.zeros((directions, batch, hidden)) if h0 is None else np.asarray(h0, np.float64)
    if layout == 1 and inputs.get("initial_h") is not None:
        h0 = h0.transpose(1, 0, 2)
    hall = np.zeros((steps, directions, batch, hidden))
    zrh = np.zeros((steps, directions, batch, 3 * hidden))
    ht = np.zeros((directions, batch, hidden))
    for d in range(directions):
        f, g = attrs.activations[d][0], attrs.activations[d][1]
        wz, wr, wh = np.split(W[d], 3)
        rz, rr, rh = np.split(R[d], 3)
        wbz, wbr, wbh, rbz, rbr, rbh = np.split(B[d], 6)
        order = range(steps - 1, -1, -1) if attrs.is_reverse(d) else range(steps)
        state = h0[d].copy()
        for t in order:
            active = t < lens
            x = X[t]
            z = _gate(f, mm(x, wz.T) + mm(state, rz.T) + wbz + rbz, attrs.clip)
            r = _gate(f, mm(x, wr.T) + mm(state, rr.T) + wbr + rbr, attrs.clip)
            if linear_before_reset:
                pre = mm(x, wh.T) + r * (mm(state, rh.T) + rbh) + wbh
            else:
                pre = mm(x, wh.T) + mm(r * state, rh.T) + rbh + wbh
            h = _gate(g, pre, attrs.clip)
            new = (1.0 - z) * h + z * state
            state = np.where(active[:, None], new, state)
            hall[t, d] = np.where(active[:, None], new, 0.0)
            zrh[t, d] = np.where(active[:, None], np.concatenate([z, r, h], axis=1), 0.0)
        ran = (lens > 0) & (steps > 0)
        ht[d] = np.where(ran[:, None], state, 0.0)
    if layout == 1:
        return {"HAll": hall.transpose(2, 0, 1, 3), "Ht": ht.transpose(1, 0, 2), "ZRH": zrh.transpose(2, 0, 1, 3)}
    return {"HAll": hall, "Ht": ht, "ZRH": zrh}


def _gate(act: Activation, pre: _Array, clip: float | None) -> _Array:
    return act(pre if clip is None else np.clip(pre, -clip, clip))


def gru_grad(inputs: Mapping[str, _Array | None], **attributes: Any) -> dict[str, _Array]:
    """GRUGrad in float64: dX, dW, dR, dB, dH0 from the forward inputs, the stash and the upstream gradients.

    Every gate derivative is read off the stash (ZRH), as the kernel reads it, so a stash from another
    implementation gives that implementation's gradients; only q = H_{t-1} R_h^T + Rb_h is recomputed.

    Args:
        inputs: GRUGrad's inputs by port name (None or absent: omitted; omitted gradients count as zeros).
        **attributes: The forward node's attributes.

    Returns:
        Every output port name -> float64 array, in the layout the attributes name.
    """
    values, linear_before_reset = _gru_activations(attributes)
    attrs = parse_attributes(values)
    mm = functools.partial(matmul, attrs.matmul_precision)  # every GEMM, at the node's precision
    hidden, layout, directions = attrs.hidden_size, attrs.layout, attrs.num_directions

    def layout0(name: str, batch_axis: int) -> _Array | None:
        return _reference._to_layout0(inputs.get(name), layout, batch_axis)

    X = layout0("X", 1)
    assert X is not None  # a required input
    steps, batch, _ = X.shape
    W = np.asarray(inputs["W"], np.float64)
    R = np.asarray(inputs["R"], np.float64)
    B = inputs.get("B")
    B = np.zeros((directions, 6 * hidden)) if B is None else np.asarray(B, np.float64)
    state_shape = (directions, batch, hidden)
    seq_shape = (steps, directions, batch, hidden)
    h0, grad_ht = (layout0(name, 1) for name in ("initial_h", "grad_Ht"))
    h0 = np.zeros(state_shape) if h0 is None else h0
    grad_ht = np.zeros(state_shape) if grad_ht is None else grad_ht
    hall, zrh, grad_hall = (layout0(name, 2) for name in ("HAll", "ZRH", "grad_HAll"))
    assert hall is not None  # required inputs
    assert zrh is not None
    grad_hall = np.zeros(seq_shape) if grad_hall is None else grad_hall
    lens = inputs.get("sequence_lens")
    lens = np.full(batch, steps) if lens is None else np.asarray(lens, np.int64)
    dtype = np.asarray(inputs["X"]).dtype
    dX = np.zeros_like(X)
    dW, dR = np.zeros_like(W), np.zeros_like(R)
    dB = np.zeros((directions, 6 * hidden))
    dH0 = np.zeros(state_shape)
    for d in range(directions):
        f, g = attrs.activations[d][0], attrs.activations[d][1]
        rh, rbh = R[d, 2 * hidden :], B[d, 5 * hidden :]
        reverse = attrs.is_reverse(d)
        dH = np.where(((lens > 0) & (steps > 0))[:, None], grad_ht[d], 0.0)
        for t in range(steps) if reverse else range(steps - 1, -1, -1):  # processing order, reversed
            active = (t < lens)[:, None]
            before = t + 1 if reverse else t - 1
            has_before = ((before >= 0) & (before < lens))[:, None]
            h_prev = np.where(has_before, hall[min(max(before, 0), steps - 1), d], h0[d])
            z, r, h = np.split(zrh[t, d], 3, axis=1)
            dH_t = dH + grad_hall[t, d]
            dz = dH_t * (h_prev - h) * _reference._gate_derivative(f, z, attrs.clip, dtype)
            dh = dH_t * (1.0 - z) * _reference._gate_derivative(g, h, attrs.clip, dtype)
            if linear_before_reset:
                dq = dh * r
                dr = dh * (mm(h_prev, rh.T) + rbh) * _reference._gate_derivative(f, r, attrs.clip, dtype)
                dH_prev = dH_t * z + mm(dq, rh)
                dR[d, 2 * hidden :] += mm(np.where(active, dq, 0.0).T, h_prev)
            else:
                dq = dh
                back = mm(dh, rh)
                dr = back * h_prev * _reference._gate_derivative(f, r, attrs.clip, dtype)
                dH_prev = dH_t * z + back * r
                dR[d, 2 * hidden :] += mm(np.where(active, dh, 0.0).T, r * h_prev)
            dpre = np.where(active, np.concatenate([dz, dr, dh], axis=1), 0.0)
            dq = np.where(active, dq, 0.0)
            dX[t] += mm(dpre, W[d])
            dW[d] += mm(dpre.T, X[t])
            dR[d, : 2 * hidden] += mm(dpre[:, : 2 * hidden].T, h_prev)
            dB[d] += np.concatenate([dpre.sum(axis=0), dpre[:, : 2 * hidden].sum(axis=0), dq.sum(axis=0)])
            dH_prev = dH_prev + mm(dpre[:, : 2 * hidden], R[d, : 2 * hidden])
            dH = np.where(active, dH_prev, dH)  # an inactive step passes its state through unchanged
        dH0[d] = dH
    moved = {"dX": (dX, 1), "dH0": (dH0, 1)}
    result = {name: np.moveaxis(value, axis, 0) if layout == 1 else value for name, (value, axis) in moved.items()}
    return {**result, "dW": dW, "dR": dR, "dB": dB}


def gru_training_op(inputs: Mapping[str, _Array | None], **attributes: Any) -> dict[str, _Array]:
    """GRUTraining as ``ortlstm.reference`` runs it: inputs checked as the kernel checks them, outputs in X's type."""
    values, _ = _gru_activations(attributes)
    _, dtype = _reference._dims_and_dtype(schema.GRU_TRAINING, inputs, parse_attributes(values))
    return {name: value.astype(dtype) for name, value in gru_training(inputs, **attributes).items()}


def gru_grad_op(inputs: Mapping[str, _Array | None], **attributes: Any) -> dict[str, _Array]:
    """GRUGrad as ``ortlstm.reference`` runs it: inputs and activations checked, outputs in X's type."""
    values, _ = _gru_activations(attributes)
    attrs = parse_attributes(values)
    _reference._check_grad_activations(attrs, schema.GRU_GRAD.name)
    _, dtype = _reference._dims_and_dtype(schema.GRU_GRAD, inputs, attrs)
    return {name: value.astype(dtype) for name, value in gru_grad(inputs, **attributes).items()}
