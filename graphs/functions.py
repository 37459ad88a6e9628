"""The LSTM forward/backward pair as onnxscript functions, for models written in onnxscript.

``lstm_with_gradients`` runs LSTMTraining and feeds its stash to LSTMGrad, like
``build_gradient_model`` does as a model. onnxscript calls ops positionally, so the call below
spells out the port order; ``tests/test_graphs.py`` checks the function's nodes against the
spec's gradient definition, so a change of the contract fails there rather than here silently.
Inputs of the function that a caller leaves empty are absent in the inner nodes, as in ONNX.
"""

from __future__ import annotations

from onnxscript import FLOAT, INT32, script

from ortlstm.ops import opset

ortlstm_ops = opset()


@script(opset=ortlstm_ops, default_opset=ortlstm_ops)
def lstm_with_gradients(  # noqa: ANN201 - onnxscript derives the outputs from the return statement
    X: FLOAT,
    W: FLOAT,
    R: FLOAT,
    B: FLOAT,
    sequence_lens: INT32,
    initial_h: FLOAT,
    initial_c: FLOAT,
    P: FLOAT,
    grad_HAll: FLOAT,
    grad_Ht: FLOAT,
    grad_Ct: FLOAT,
    hidden_size: int,
    direction: str = "forward",
    layout: int = 0,
    input_forget: int = 0,
):
    """LSTM outputs and the gradients of every input, from upstream gradients of the outputs."""
    HAll, Ht, Ct, CAll, IOFC = ortlstm_ops.LSTMTraining(
        X,
        W,
        R,
        B,
        sequence_lens,
        initial_h,
        initial_c,
        P,
        hidden_size=hidden_size,
        direction=direction,
        layout=layout,
        input_forget=input_forget,
    )
    dX, dW, dR, dB, dH0, dC0, dP = ortlstm_ops.LSTMGrad(
        X,
        W,
        R,
        sequence_lens,
        initial_h,
        initial_c,
        HAll,
        CAll,
        IOFC,
        grad_HAll,
        grad_Ht,
        grad_Ct,
        P,
        hidden_size=hidden_size,
        direction=direction,
        layout=layout,
        input_forget=input_forget,
    )
    return HAll, Ht, Ct, CAll, IOFC, dX, dW, dR, dB, dH0, dC0, dP
