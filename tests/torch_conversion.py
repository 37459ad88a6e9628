"""PyTorch ``nn.LSTM`` weights in ONNX LSTM layout, for the tests that cross-check against torch.

torch stacks the four gates of a weight or bias as i, f, g, o; ONNX LSTM (and ortlstm) as
i, o, f, c, where ONNX's c is torch's g. ONNX's B is ``[Wb, Rb]``, i.e. torch's ``bias_ih``
then ``bias_hh``, each reordered; both directions of a bidirectional layer stack on a leading
axis, forward first. Pure NumPy: nothing here imports torch, so it imports anywhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np

TORCH_GATES = "ifgo"
ONNX_GATES_AS_TORCH = "iofg"  # ONNX i, o, f, c in torch's names (c is torch's g)


def torch_ifgo_to_onnx_iofc(stacked: np.ndarray) -> np.ndarray:
    """Reorders the gate blocks along axis 0 from torch's i, f, g, o to ONNX's i, o, f, c.

    Works for ``weight_ih`` / ``weight_hh`` ([4*hidden, ...]), ``bias_ih`` / ``bias_hh``
    ([4*hidden]) and their gradients alike: the gradient of a reordered parameter is the
    reordered gradient.
    """
    blocks = dict(zip(TORCH_GATES, np.split(np.asarray(stacked), 4, axis=0), strict=True))
    return np.concatenate([blocks[gate] for gate in ONNX_GATES_AS_TORCH], axis=0)


def lstm_direction_suffixes(lstm: Any) -> tuple[str, ...]:
    """The parameter-name suffixes of an ``nn.LSTM``'s directions, in ONNX order (forward first)."""
    return ("", "_reverse") if lstm.bidirectional else ("",)


def lstm_layer_sources(lstm: Any, layer: int) -> dict[str, tuple[str, ...]]:
    """The torch parameter names (relative to ``lstm``) that ONNX W, R and B of ``layer`` are made of."""
    suffixes = lstm_direction_suffixes(lstm)
    sources = {
        "W": tuple(f"weight_ih_l{layer}{suffix}" for suffix in suffixes),
        "R": tuple(f"weight_hh_l{layer}{suffix}" for suffix in suffixes),
    }
    if lstm.bias:
        sources["B"] = tuple(f"{kind}_l{layer}{suffix}" for suffix in suffixes for kind in ("bias_ih", "bias_hh"))
    return sources


def lstm_layer_onnx_weights(lstm: Any, layer: int) -> dict[str, np.ndarray]:
    """ONNX LSTM inputs W ``[D, 4H, I]``, R ``[D, 4H, H]`` and (with bias) B ``[D, 8H]`` of one layer.

    Args:
        lstm: A ``torch.nn.LSTM`` without projections (``proj_size == 0``).
        layer: The layer index, 0-based.
    """
    if getattr(lstm, "proj_size", 0):
        raise ValueError("nn.LSTM with proj_size > 0 has no ONNX LSTM equivalent")

    def value(name: str) -> np.ndarray:
        return getattr(lstm, name).detach().cpu().numpy()

    suffixes = lstm_direction_suffixes(lstm)
    weights = {
        "W": np.stack([torch_ifgo_to_onnx_iofc(value(f"weight_ih_l{layer}{s}")) for s in suffixes]),
        "R": np.stack([torch_ifgo_to_onnx_iofc(value(f"weight_hh_l{layer}{s}")) for s in suffixes]),
    }
    if lstm.bias:
        weights["B"] = np.stack(
            [
                np.concatenate(
                    [
                        torch_ifgo_to_onnx_iofc(value(f"bias_ih_l{layer}{s}")),
                        torch_ifgo_to_onnx_iofc(value(f"bias_hh_l{layer}{s}")),
                    ]
                )
                for s in suffixes
            ]
        )
    return weights
