"""int8 models made trainable: onnxruntime.quantization's dynamic patterns become float ops (issue 32).

``onnxruntime.quantization.quantize_dynamic`` (and its older form, producer ``onnx.quantize``) stores
weights as int8/uint8 initializers with a scale and a zero point, and computes with them in integer
ops whose weights have no gradient: ddddocr's default model ``common_old.onnx`` is one. Each such
pattern is rewritten into the float op it was made from, its weight dequantized once,
``(q - zero_point) * scale`` per tensor, per direction or per channel as the scale's shape says,
so the weight trains as a float32 parameter:

- com.microsoft ``DynamicQuantizeLSTM`` -> ONNX ``LSTM``: W and R are stored transposed,
  [D, input, 4H] and [D, H, 4H], with a scale per direction ([D]) or per gate row ([D, 4H]); B,
  sequence_lens, initial_h, initial_c and P stay as they are;
- ``DynamicQuantizeLinear(x)`` -> ``MatMulInteger``/``ConvInteger`` with a weight initializer ->
  ``Cast`` -> ``Mul(x_scale * w_scale)`` -> ``MatMul``/``Conv`` of ``x``; the older quantizer's
  bias, added in int32 after ``Floor(B / (x_scale * w_scale))``, becomes the float ``B`` again;
- com.microsoft ``DynamicQuantizeMatMul`` (what an optimized session saves) -> ``MatMul`` (+ bias).

The float weight takes the name of the int8 initializer without the ``_quantized`` suffix the
quantizer added: the name of the float weight the model was quantized from, which
``quantize_dynamic`` of the trained model quantizes again under the same names. The forward
differs from the int8 model's only by the rounding of the activations, which the int8 ops
quantize on every call and the float ops do not.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, NoReturn

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from ortlstm.graphs.autodiff.registry import register_missing_rule_hint
from ortlstm.graphs.emit.checks import make_checked_node
from ortlstm.graphs.emit.emitter import onnx_opset
from ortlstm.graphs.emit.graph_utils import reads_in_subgraphs, unique_name, used_names
from ortlstm.graphs.prepare.state import Preparation, is_onnx

INT8_LSTM = ("com.microsoft", "DynamicQuantizeLSTM")
QUANTIZE_CHOICES = ("dynamic",)
"""How a trained model may be exported quantized again: onnxruntime.quantization.quantize_dynamic's way."""
_INTEGER_OPS = {"MatMulInteger": "MatMul", "ConvInteger": "Conv"}
_FUSED_MATMUL = ("com.microsoft", "DynamicQuantizeMatMul")
_INT8_TYPES = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.UINT8})
_ADVICE = (
    "ortlstm dequantizes the weight initializers that onnxruntime.quantization.quantize_dynamic writes; "
    "train the float model this one was quantized from instead, or freeze this part"
)


@dataclasses.dataclass(frozen=True)
class Dequantized:
    """One float weight made from an int8 initializer.

    Attributes:
        name: The float initializer (a trainable parameter).
        quantized: The int8 initializer it was dequantized from.
        node: The quantized node, as ``'name' (Op input)``.
        scale: ``per tensor``, ``per direction`` or ``per channel``.
    """

    name: str
    quantized: str
    node: str
    scale: str

    def describe(self) -> str:
        """One line for ``Trainer.summary()``."""
        return f"{self.name} <- int8 {self.quantized} of {self.node}, {self.scale} scale"


def is_quantized(model: onnx.ModelProto) -> bool:
    """Whether the main graph holds an integer op of onnxruntime.quantization's dynamic patterns."""
    return any(_kind(node) is not None for node in model.graph.node)


def describe_int8(model: onnx.ModelProto) -> tuple[str, ...]:
    """For ``Trainer.summary()``: each float32 parameter of ``model``'s training made from an int8 weight."""
    return tuple(item.describe() for item in dequantize_model(model)[1]) if is_quantized(model) else ()


@dataclasses.dataclass(frozen=True)
class Quantization:
    """How an int8 model was quantized, so that its trained float model is quantized the same way.

    The weights are int8 again whatever the shipped ones were: uint8 weights (the older quantizer's
    default, ddddocr's ConvInteger and MatMulInteger) lost the fine-tuning's gain there (held-out CER
    0.042 in float32, 0.032 re-quantized to int8, 0.162 to uint8; docs/training.md).

    Attributes:
        per_channel: A scale per channel (per gate row of an LSTM) rather than per tensor (per direction).
    """

    per_channel: bool = False


def quantization_of(model: onnx.ModelProto) -> Quantization:
    """How ``model``'s weights were quantized; quantize_dynamic's default (per tensor) for a float model."""
    initializers = {init.name: init for init in model.graph.initializer}
    per_channel = False
    for node in model.graph.node:
        kind = _kind(node)
        # A zero point per direction [D] or per gate row [D, 4H]; per tensor (a scalar) or per channel.
        index, channel_rank = (9, 2) if kind == "DynamicQuantizeLSTM" else (3, 1)
        if kind in (INT8_LSTM[1], *_INTEGER_OPS) and index < len(node.input) and node.input[index] in initializers:
            zero = initializers[node.input[index]]
            per_channel |= len(zero.dims) >= channel_rank and int(np.prod(zero.dims)) > 1
    return Quantization(per_channel)


def _kind(node: onnx.NodeProto) -> str | None:
    if (node.domain, node.op_type) in (INT8_LSTM, _FUSED_MATMUL):
        return node.op_type
    if is_onnx(node) and node.op_type in _INTEGER_OPS:
        return node.op_type
    return None


def dequantize_model(model: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[Dequantized, ...]]:
    """A copy of ``model`` with every dynamic int8 pattern of its main graph as float ops (module docstring).

    Returns:
        ``(float model, the weights dequantized)``; ``model`` itself is not changed.

    Raises:
        ValueError: A quantized node whose weights are not initializers, or whose pattern is not one
            ``quantize_dynamic`` writes (named, with what was found).
    """
    result = copy.deepcopy(model)
    return result, _Rewriter(result.graph, onnx_opset(result)).run()


def dequantize_int8(state: Preparation) -> None:
    """The pipeline's step: int8 weights become float32 parameters (``dequantize_model``), always trained."""
    if not is_quantized(state.model):
        return
    state.dequantized = _Rewriter(state.graph, onnx_opset(state.model)).run()
    state.kept.update(item.name for item in state.dequantized)  # candidates whatever metadata says


class _Rewriter:
    """One pass over a main graph: each quantized node replaced where it stands, the dead pattern removed."""

    def __init__(self, graph: onnx.GraphProto, opset: int) -> None:
        self.graph = graph
        self.opset = opset  # the model's ai.onnx opset, which the float nodes are checked against
        self.nodes = list(graph.node)  # held for the whole pass, so that id() names each node
        self.initializers = {init.name: init for init in graph.initializer}
        self.producer = {name: node for node in self.nodes for name in node.output if name}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        self.taken = used_names(graph)
        self.replaced: dict[int, list[onnx.NodeProto]] = {}  # id of the pattern's last node -> its float nodes
        self.dropped: set[int] = set()
        self.made: list[Dequantized] = []

    def run(self) -> tuple[Dequantized, ...]:
        nodes = self.nodes
        for node in nodes:
            kind = _kind(node)
            if kind == "DynamicQuantizeLSTM":
                self.replaced[id(node)] = [self._lstm(node)]
            elif kind == "DynamicQuantizeMatMul":
                self.replaced[id(node)] = self._fused_matmul(node)
            elif kind is not None:
                last, float_nodes = self._integer_op(node)
                self.replaced[id(last)] = float_nodes
        entries = [
            (id(node) in self.dropped, new) for node in nodes for new in self.replaced.get(id(node), [node])
        ]
        self._write_live(entries)
        return tuple(self.made)

    # ---- the weights ----------------------------------------------------------------------------

    def _constant(self, node: onnx.NodeProto, index: int, what: str) -> np.ndarray:
        name = node.input[index] if index < len(node.input) else ""
        if name not in self.initializers:
            raise ValueError(
                f"{_label(node)}: its {what} ({name or 'omitted'!r}) is not an initializer, so the int8 weight "
                f"cannot be dequantized; {_ADVICE}"
            )
        return onnx.numpy_helper.to_array(self.initializers[name])

    def _weight(self, node: onnx.NodeProto, index: int, scale: np.ndarray, zero: np.ndarray, axis: int) -> str:
        """Adds ``(q - zero) * scale`` as a float32 initializer; ``axis`` is where a per-channel scale runs."""
        quantized = self._constant(node, index, f"input {index} (the int8 weight)")
        if self.initializers[node.input[index]].data_type not in _INT8_TYPES:
            raise ValueError(f"{_label(node)}: input {index} ({node.input[index]!r}) is not int8 or uint8; {_ADVICE}")
        shape = [1] * quantized.ndim
        if scale.size > 1:
            shape[axis] = -1
        value = _dequantized(quantized, scale, zero, shape)
        return self._add_weight(node, index, value, "per tensor" if scale.size == 1 else "per channel")

    def _add_weight(self, node: onnx.NodeProto, index: int, value: np.ndarray, kind: str) -> str:
        quantized = node.input[index]
        base = quantized.removesuffix("_quantized") or quantized
        name = unique_name(base, self.taken)
        self.taken.add(name)
        self.graph.initializer.append(onnx.numpy_helper.from_array(value.astype(np.float32), name))
        self.made.append(Dequantized(name, quantized, f"{_label(node)} input {index}", kind))
        return name

    def _zero_point(self, node: onnx.NodeProto, index: int, like: np.ndarray) -> np.ndarray:
        if index < len(node.input) and node.input[index]:
            return self._constant(node, index, f"input {index} (the weight's zero point)")
        return np.zeros_like(like)

    # ---- the patterns ---------------------------------------------------------------------------

    def _lstm(self, node: onnx.NodeProto) -> onnx.NodeProto:
        """DynamicQuantizeLSTM -> LSTM: W [D, I, 4H] and R [D, H, 4H] dequantized and transposed to ONNX's."""
        weights = []
        for index, scale_index in ((1, 8), (2, 10)):
            quantized = self._constant(node, index, f"input {index} (the int8 weight)")
            scale = self._constant(node, scale_index, f"input {scale_index} (a weight scale)")
            zero = self._zero_point(node, scale_index + 1, scale)
            # A scale per direction [D] or per gate row [D, 4H]: broadcast over [D, I or H, 4H].
            per_row = scale.ndim == 2
            shape = [quantized.shape[0], 1, quantized.shape[2] if per_row else 1]
            value = _dequantized(quantized, scale, zero, shape)
            weights.append(
                self._add_weight(node, index, value.transpose(0, 2, 1), "per gate row" if per_row else "per direction")
            )
        inputs = [node.input[0], *weights, *list(node.input[3:8])]
        while inputs and not inputs[-1]:
            inputs.pop()
        attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
        return make_checked_node(
            self.opset,
            "LSTM",
            inputs,
            list(node.output),
            name=self._node_name(node),
            doc_string=node.doc_string,
            **attributes,
        )

    def _fused_matmul(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        """DynamicQuantizeMatMul(A, B, b_scale, b_zero_point, bias) -> MatMul(A, B') (+ bias)."""
        scale = self._constant(node, 2, "input 2 (the weight scale)")
        weight = self._weight(node, 1, scale, self._zero_point(node, 3, scale), axis=-1)
        bias = node.input[4] if len(node.input) > 4 else ""
        return self._float_nodes(node, "MatMul", [node.input[0], weight], bias, node.output[0], {})

    def _integer_op(self, node: onnx.NodeProto) -> tuple[onnx.NodeProto, list[onnx.NodeProto]]:
        """DynamicQuantizeLinear -> MatMulInteger/ConvInteger (-> int32 bias Add) -> Cast -> Mul(scales)."""
        found = _Found(node)
        quantize = self.producer.get(node.input[0])
        if quantize is None or quantize.op_type != "DynamicQuantizeLinear" or node.input[2:3] != quantize.output[2:3]:
            found.fail("its input is not made by a DynamicQuantizeLinear with that zero point")
        value, bias = node.output[0], ""
        add = self._only_reader(value, "Add", found)
        if add is not None:
            bias = self._int32_bias(add, value, found)
            value = add.output[0]
        cast = self._only_reader(value, "Cast", found)
        if cast is None:
            found.fail(f"{value!r} is not read by one Cast to float")
        mul = self._only_reader(cast.output[0], "Mul", found)
        if mul is None:
            found.fail(f"{cast.output[0]!r} is not read by one Mul by the scales")
        scales = self.producer.get(_other(mul, cast.output[0]))
        if scales is None or scales.op_type != "Mul" or quantize.output[1] not in scales.input:
            found.fail(f"Mul {mul.name!r} does not multiply by the input's scale times the weight's")
        w_scale_index = 1 - list(scales.input).index(quantize.output[1])
        scale = self._constant(scales, w_scale_index, f"input {w_scale_index} (the weight scale)")
        axis = 0 if node.op_type == "ConvInteger" else -1
        weight = self._weight(node, 1, scale, self._zero_point(node, 3, scale), axis)
        attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
        float_op = _INTEGER_OPS[node.op_type]
        self.dropped.update(id(item) for item in (quantize, node, cast, scales))
        return mul, self._float_nodes(node, float_op, [quantize.input[0], weight], bias, mul.output[0], attributes)

    def _float_nodes(
        self, node: onnx.NodeProto, op: str, inputs: list[str], bias: str, output: str, attributes: dict[str, Any]
    ) -> list[onnx.NodeProto]:
        """The float op writing ``output``; a bias is Conv's third input, or an Add after a MatMul."""
        name = self._node_name(node)
        if not bias:
            return [make_checked_node(self.opset, op, inputs, [output], name=name, **attributes)]
        if op == "Conv":
            return [make_checked_node(self.opset, op, [*inputs, bias], [output], name=name, **attributes)]
        product = unique_name(f"{output}_matmul", self.taken)
        self.taken.add(product)
        return [
            make_checked_node(self.opset, op, inputs, [product], name=name, **attributes),
            make_checked_node(
                self.opset, "Add", [product, bias], [output], name=unique_name(f"{name}_bias", self.taken)
            ),
        ]

    def _int32_bias(self, add: onnx.NodeProto, value: str, found: _Found) -> str:
        """The float bias behind the older quantizer's ``Reshape(Cast(Floor(Div(B, scales))))`` added in int32."""
        name = _other(add, value)
        chain = []
        while name in self.producer and self.producer[name].op_type in ("Reshape", "Cast", "Floor", "Round"):
            chain.append(self.producer[name])
            name = self.producer[name].input[0]
        divide = self.producer.get(name)
        if divide is None or divide.op_type != "Div" or divide.input[0] not in self.initializers:
            found.fail(f"the int32 Add {add.name!r} adds no Floor(B / scales) of a float bias initializer")
        bias = divide.input[0]
        if len(self.initializers[bias].dims) != 1:
            found.fail(f"the bias {bias!r} is not one-dimensional")
        scales = self.producer.get(divide.input[1])  # the bias's own x_scale * w_scale
        self.dropped.update(id(item) for item in (add, divide, *chain, *([scales] if scales else [])))
        return bias

    def _only_reader(self, value: str, op: str, found: _Found) -> onnx.NodeProto | None:
        readers = self.readers.get(value, [])
        if len(readers) == 1 and readers[0].op_type == op and is_onnx(readers[0]):
            self.dropped.add(id(readers[0]))
            return readers[0]
        if op != "Add" and len(readers) > 1:
            found.fail(f"{value!r} is read by {len(readers)} nodes")
        return None

    def _node_name(self, node: onnx.NodeProto) -> str:
        """The quantizer's node name without its ``_quant`` suffix: the float node's name as it was."""
        name = unique_name((node.name.removesuffix("_quant") or node.name) or node.op_type, self.taken)
        self.taken.add(name)
        return name

    def _write_live(self, entries: list[tuple[bool, onnx.NodeProto]]) -> None:
        """Writes the nodes, less the pattern's nodes nothing reads any more and the initializers only they read."""
        # The initializers the replaced patterns read (int8 weights, scales, zero points) go once nothing reads them.
        pattern_reads = {
            name
            for node in self.nodes
            if id(node) in self.dropped or id(node) in self.replaced or _kind(node) is not None
            for name in node.input
        }
        needed = {value.name for value in self.graph.output} | reads_in_subgraphs(self.graph)
        kept: list[onnx.NodeProto] = []
        for dropped, node in reversed(entries):
            if dropped and not any(name in needed for name in node.output if name):
                continue
            kept.append(node)
            needed.update(node.input)
        del self.graph.node[:]
        self.graph.node.extend(reversed(kept))
        read = [init for init in self.graph.initializer if init.name in needed or init.name not in pattern_reads]
        del self.graph.initializer[:]
        self.graph.initializer.extend(read)


class _Found:
    """Raises the refusal of one integer node whose pattern is not quantize_dynamic's."""

    def __init__(self, node: onnx.NodeProto) -> None:
        self.node = node

    def fail(self, why: str) -> NoReturn:
        raise ValueError(f"{_label(self.node)} cannot be dequantized: {why}; {_ADVICE}")


def _dequantized(quantized: np.ndarray, scale: np.ndarray, zero: np.ndarray, shape: list[int]) -> np.ndarray:
    """``(q - zero_point) * scale`` in float32, as onnxruntime's kernels compute it (scale and zero point broadcast)."""
    return (quantized.astype(np.float32) - zero.astype(np.float32).reshape(shape)) * scale.astype(np.float32).reshape(
        shape
    )


def _other(node: onnx.NodeProto, name: str) -> str:
    """The input of a two-input node that is not ``name``."""
    inputs = list(node.input)
    return inputs[1] if inputs[0] == name else inputs[0]


def _label(node: onnx.NodeProto) -> str:
    domain = f"{node.domain}::" if node.domain else ""
    return f"{node.name or '(unnamed)'!r} ({domain}{node.op_type})"


INT8_HINT = (
    "int8 ops have no gradient. ortlstm dequantizes the patterns onnxruntime.quantization.quantize_dynamic writes "
    "in the main graph (DynamicQuantizeLSTM; DynamicQuantizeLinear + MatMulInteger / ConvInteger with weight "
    "initializers) into float32 parameters before training; this node is outside them (static QDQ quantization, "
    "a subgraph, weights computed at run time): train the float model it was quantized from (then "
    "export(path, quantize='dynamic')), or freeze the parameters behind it."
)
_INT8_OPS = (
    ("", "DynamicQuantizeLinear"),
    ("", "MatMulInteger"),
    ("", "ConvInteger"),
    ("", "QuantizeLinear"),
    INT8_LSTM,
    _FUSED_MATMUL,
    ("com.microsoft", "MatMulIntegerToFloat"),
)
for _domain, _op_type in _INT8_OPS:
    register_missing_rule_hint(_domain, _op_type, INT8_HINT)


def int8_nodes(graph: onnx.GraphProto) -> list[str]:
    """The int8 nodes left in a prepared main graph (``'name' (Op)``): what cuts a parameter off the loss."""
    return [_label(node) for node in graph.node if (node.domain or "", node.op_type) in _INT8_OPS]
