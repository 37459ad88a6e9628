"""Gradients of the ONNX losses (through the autodiff engine) against torch autograd's, recorded.

For every recorded loss case (see test_losses.py), the loss graph is differentiated with
``ortlstm.graphs.autodiff.build_backward`` with respect to the input (the seed is ones, so
reduction="none" gives the gradient of ``loss.sum()``, as recorded) and run in onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper
import onnxruntime as ort
import pytest
from test_losses import CASES, build_loss_model, loss_spec, recorded

FLOAT64_RTOL = 1e-10
FLOAT64_ATOL = 1e-12
FLOAT32_RTOL = 1e-4
FLOAT32_ATOL = 1e-5
TOLERANCES = {"float32": (FLOAT32_RTOL, FLOAT32_ATOL), "float64": (FLOAT64_RTOL, FLOAT64_ATOL)}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_gradient_matches_torch(name: str, dtype: str) -> None:
    from ortlstm.graphs.autodiff import build_backward

    case = CASES[name]
    data = recorded(case, dtype)
    model, emitter, loss = build_loss_model(loss_spec(case), data["input"], data["target"])
    backward = build_backward(model.graph, loss, ["input"], emitter)
    grad = backward.gradients["input"]
    graph = model.graph
    graph.node.extend(emitter.nodes[len(graph.node) :])
    known = {init.name for init in graph.initializer}
    graph.initializer.extend(init for init in emitter.initializers if init.name not in known)
    elem_type = onnx.helper.np_dtype_to_tensor_dtype(data["input"].dtype)
    graph.output.append(onnx.helper.make_tensor_value_info(grad, elem_type, list(data["input"].shape)))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _, value = session.run(None, {"input": data["input"], "target": data["target"]})
    rtol, atol = TOLERANCES[dtype]
    np.testing.assert_allclose(value, data["grad"], rtol=rtol, atol=atol, equal_nan=True)
