"""A NumPy float64 reference of GRUTraining, written from the equations in docs/ops.md.

An oracle for the kernel tests that shares no code with the kernels: the forward of ONNX GRU with
every attribute the op takes (linear_before_reset 0 and 1, directions, sequence_lens, clip, all
activations with alpha/beta, layout 1), and the ZRH stash. Attributes are parsed by
``ortlstm.reference.parse_attributes`` (the LSTM's rules, which the GRU shares), so the two ops
read activations, alpha, beta and clip alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ortlstm.ops import schema
from ortlstm.reference import Activation, parse_attributes

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
            z = _gate(f, x @ wz.T + state @ rz.T + wbz + rbz, attrs.clip)
            r = _gate(f, x @ wr.T + state @ rr.T + wbr + rbr, attrs.clip)
            if linear_before_reset:
                pre = x @ wh.T + r * (state @ rh.T + rbh) + wbh
            else:
                pre = x @ wh.T + (r * state) @ rh.T + rbh + wbh
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
