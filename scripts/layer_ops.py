"""Which ONNX ops torch.nn's activation, normalization and pooling layers export to, and which lack a gradient rule.

Run in an environment with torch (the training one)::

    .venvs/train/bin/python scripts/layer_ops.py            # a markdown table
    .venvs/train/bin/python scripts/layer_ops.py --missing  # only the layers with an op lacking a rule

Each layer is exported three times: with ``torch.onnx.export``'s defaults (dynamo=True, optimize=True,
its default opset), the same with ``opset_version=NEWEST_OPSET``, and with ``dynamo=False``
(TorchScript, opset 17). A model is one layer in train mode (BatchNorm is exported in inference
form all the same: the table notes its training_mode) on a small input. An op is listed as *missing* when
``ortlstm.graphs.autodiff`` has no gradient rule for it and it lies between the layer's parameters
(or its input, for parameter-free layers) and the output: Shape, Constant and the like carry no
gradient and are not listed. Why a script: the set changes with torch's exporters, so the table in
docs/training.md is regenerated rather than maintained by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator

import onnx
import torch
from torch import nn

from ortlstm.graphs.autodiff import gradient_rule

# Ops that take no gradient from the output (integer-valued, shape arithmetic, constants).
_NOT_ON_A_GRADIENT_PATH = {
    *("Shape", "Size", "Constant", "ConstantOfShape", "Range", "NonZero", "ArgMax", "ArgMin"),
    *("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "IsNaN", "IsInf"),
    *("Sign", "Floor", "Ceil", "Round"),
}

NEWEST_OPSET = 23
"""The newest opset asked of the dynamo exporter: RMSNorm and GroupNorm become single ops (opsets 23, 21)."""

LAYERS: list[tuple[str, Callable[[], nn.Module], tuple[int, ...]]] = [
    ("ReLU", nn.ReLU, (2, 3, 8)),
    ("ReLU6", nn.ReLU6, (2, 3, 8)),
    ("LeakyReLU", nn.LeakyReLU, (2, 3, 8)),
    ("PReLU", lambda: nn.PReLU(3), (2, 3, 8)),
    ("ELU", nn.ELU, (2, 3, 8)),
    ("SELU", nn.SELU, (2, 3, 8)),
    ("CELU", lambda: nn.CELU(0.7), (2, 3, 8)),
    ("GELU", nn.GELU, (2, 3, 8)),
    ("GELU(tanh)", lambda: nn.GELU(approximate="tanh"), (2, 3, 8)),
    ("SiLU", nn.SiLU, (2, 3, 8)),
    ("Mish", nn.Mish, (2, 3, 8)),
    ("Hardswish", nn.Hardswish, (2, 3, 8)),
    ("Hardsigmoid", nn.Hardsigmoid, (2, 3, 8)),
    ("Hardtanh", nn.Hardtanh, (2, 3, 8)),
    ("Softplus", nn.Softplus, (2, 3, 8)),
    ("Softplus(beta=2)", lambda: nn.Softplus(beta=2.0, threshold=10.0), (2, 3, 8)),
    ("Softsign", nn.Softsign, (2, 3, 8)),
    ("Tanhshrink", nn.Tanhshrink, (2, 3, 8)),
    ("Softshrink", nn.Softshrink, (2, 3, 8)),
    ("Hardshrink", nn.Hardshrink, (2, 3, 8)),
    ("Threshold", lambda: nn.Threshold(0.1, 20.0), (2, 3, 8)),
    ("LogSigmoid", nn.LogSigmoid, (2, 3, 8)),
    ("Sigmoid", nn.Sigmoid, (2, 3, 8)),
    ("Tanh", nn.Tanh, (2, 3, 8)),
    ("Softmax", lambda: nn.Softmax(dim=-1), (2, 3, 8)),
    ("LogSoftmax", lambda: nn.LogSoftmax(dim=-1), (2, 3, 8)),
    ("Softmin", lambda: nn.Softmin(dim=-1), (2, 3, 8)),
    ("Softmax2d", nn.Softmax2d, (2, 3, 4, 4)),
    ("GLU", nn.GLU, (2, 3, 8)),
    ("BatchNorm1d", lambda: nn.BatchNorm1d(3), (2, 3, 8)),
    ("BatchNorm2d", lambda: nn.BatchNorm2d(3), (2, 3, 4, 4)),
    ("LayerNorm", lambda: nn.LayerNorm(8), (2, 3, 8)),
    ("GroupNorm", lambda: nn.GroupNorm(1, 3), (2, 3, 8)),
    ("InstanceNorm1d", lambda: nn.InstanceNorm1d(3, affine=True), (2, 3, 8)),
    ("InstanceNorm2d", lambda: nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 4)),
    ("LocalResponseNorm", lambda: nn.LocalResponseNorm(2), (2, 3, 4, 4)),
    ("RMSNorm", lambda: nn.RMSNorm(8), (2, 3, 8)),
    ("MaxPool1d", lambda: nn.MaxPool1d(2), (2, 3, 8)),
    ("MaxPool2d", lambda: nn.MaxPool2d(2), (2, 3, 4, 4)),
    ("AvgPool1d", lambda: nn.AvgPool1d(2), (2, 3, 8)),
    ("AvgPool2d", lambda: nn.AvgPool2d(2), (2, 3, 4, 4)),
    ("AdaptiveAvgPool1d", lambda: nn.AdaptiveAvgPool1d(1), (2, 3, 8)),
    ("AdaptiveAvgPool2d", lambda: nn.AdaptiveAvgPool2d(1), (2, 3, 4, 4)),
    ("AdaptiveAvgPool2d(2)", lambda: nn.AdaptiveAvgPool2d(2), (2, 3, 4, 4)),
    ("AdaptiveMaxPool1d", lambda: nn.AdaptiveMaxPool1d(1), (2, 3, 8)),
    ("AdaptiveMaxPool2d", lambda: nn.AdaptiveMaxPool2d(1), (2, 3, 4, 4)),
    ("AdaptiveMaxPool2d(2)", lambda: nn.AdaptiveMaxPool2d(2), (2, 3, 4, 4)),
    ("LPPool1d", lambda: nn.LPPool1d(2, 2), (2, 3, 8)),
    ("LPPool2d", lambda: nn.LPPool2d(2, 2), (2, 3, 4, 4)),
]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silences the exporters, whose C++ side prints graphs to the process's stdout and stderr."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(os.devnull, "w") as null, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def export(module: nn.Module, shape: tuple[int, ...], dynamo: bool, opset: int | None = None) -> onnx.ModelProto:
    """The layer exported with torch.onnx.export's defaults (dynamo; ``opset``: another opset) or TorchScript (17)."""
    buffer = io.BytesIO()
    with _quiet():
        if dynamo:
            program = torch.onnx.export(module, (torch.randn(shape),), dynamo=True, opset_version=opset)
            program.save(buffer) if program is not None else None
        else:
            torch.onnx.export(module, (torch.randn(shape),), buffer, dynamo=False, opset_version=17)
    return onnx.load_from_string(buffer.getvalue())


def ops_on_the_path(model: onnx.ModelProto) -> list[str]:
    """The ops between the model's input or float initializers and its outputs, in graph order, each once."""
    graph = model.graph
    live = {value.name for value in graph.input} | {
        init.name for init in graph.initializer if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)
    }
    found: list[str] = []
    for node in graph.node:
        if node.op_type in _NOT_ON_A_GRADIENT_PATH or not any(name in live for name in node.input):
            continue
        live.update(node.output)
        label = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        if node.op_type == "BatchNormalization":  # train mode or not: the rule differentiates only 0
            mode = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "training_mode"), 0)
            label += f" (training_mode={mode})"
        if label not in found:
            found.append(label)
    return found


def missing(ops: list[str]) -> list[str]:
    """The ops of ``ops`` without a registered gradient rule."""
    lacking = []
    for op in ops:
        name = op.split(" ", 1)[0]  # without the "(training_mode=...)" note
        domain, op_type = name.split("::") if "::" in name else ("", name)
        if gradient_rule(domain, op_type) is None:
            lacking.append(op)
    return lacking


def _cell(ops: list[str], lacking: list[str]) -> str:
    return ", ".join(f"**{op}**" if op in lacking else op for op in ops) or "(none)"


def main(argv: list[str] | None = None) -> int:
    """The command line: prints the table of layers and their ops."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--missing", action="store_true", help="only the layers with an op that lacks a rule")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    logging.getLogger("torch").setLevel(logging.ERROR)
    print(f"| layer | dynamo (default) | dynamo, opset {NEWEST_OPSET} | TorchScript (opset 17) |")
    print("|---|---|---|---|")
    for name, make, shape in LAYERS:
        module = make().train()
        cells = []
        lacking_any = False
        for dynamo, opset in ((True, None), (True, NEWEST_OPSET), (False, None)):
            try:
                ops = ops_on_the_path(export(module, shape, dynamo, opset))
            except Exception as error:  # an exporter's failure is a row of the table, not the script's end
                cells.append(f"export fails: {type(error).__name__}")
                continue
            lacking = missing(ops)
            lacking_any = lacking_any or bool(lacking)
            cells.append(_cell(ops, lacking))
        if lacking_any or not args.missing:
            print(f"| {name} | {' | '.join(cells)} |")
    print("\n(**bold**: no gradient rule)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
