"""Appends nodes to an ONNX graph under construction: fresh names, typed constants, opset-aware helpers.

Every builder of training graphs (gradient rules, losses, optimizers, the train step) emits its
nodes through one ``GraphEmitter``, so names never collide with the model's, constants get the
element type of the values they combine with, and the handful of ops whose signature changed
between opsets (ReduceSum/ReduceMean/ReduceMax axes, Squeeze/Unsqueeze axes, Split sizes) are
written in the form the model's ai.onnx opset expects. Each node is checked against its op's
schema as it is made (``checks.check_node``), so a misspelt op or attribute or a wrong count of
inputs fails at the first build. Protos only; nothing here runs a model.

This is the ground floor of ``ortlstm.graphs``: it imports only ``ortlstm.ops`` and onnx, and
every builder (autodiff, losses, optimizers, prepare, the train step) imports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from ortlstm.graphs.emit.checks import check_parts

# used_names lives in graph_utils; rules and tests import it from here too.
from ortlstm.graphs.emit.graph_utils import unique_name, used_names  # noqa: F401

MIN_OPSET = 13
"""The oldest ai.onnx opset the builders emit for (axes of ReduceSum/Squeeze/Unsqueeze are inputs)."""

FLOAT_TYPES = frozenset(
    {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
)
"""Element types that carry gradients."""


@dataclasses.dataclass(frozen=True)
class ValueType:
    """What static inference knows of a value: its element type and shape.

    Attributes:
        elem_type: ONNX ``TensorProto`` data type, 0 when unknown.
        shape: One entry per axis, an int for a static dim, a str for a symbolic one, None for an
            unknown one; None when even the rank is unknown.
    """

    elem_type: int
    shape: tuple[int | str | None, ...] | None

    @property
    def rank(self) -> int | None:
        """The rank, when known."""
        return None if self.shape is None else len(self.shape)

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape when every dim is a known integer."""
        if self.shape is None or not all(isinstance(dim, int) for dim in self.shape):
            return None
        return tuple(int(dim) for dim in self.shape)  # type: ignore[arg-type]


def value_type_of(value_info: onnx.ValueInfoProto) -> ValueType | None:
    """The ``ValueType`` of a tensor ``ValueInfoProto``, or None for a non-tensor."""
    if not value_info.type.HasField("tensor_type"):
        return None
    tensor = value_info.type.tensor_type
    shape: tuple[int | str | None, ...] | None = None
    if tensor.HasField("shape"):
        dims: list[int | str | None] = []
        for dim in tensor.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param"):
                dims.append(dim.dim_param)
            else:
                dims.append(None)
        shape = tuple(dims)
    return ValueType(tensor.elem_type, shape)


def infer_value_types(model: onnx.ModelProto) -> dict[str, ValueType]:
    """Static element types and shapes of the main graph's values (onnx shape inference).

    The ortlstm op schemas must be registered with onnx (``import ortlstm.ops``) for the types
    behind LSTMTraining nodes to be known.
    """
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    graph = inferred.graph
    types: dict[str, ValueType] = {}
    for init in graph.initializer:
        types[init.name] = ValueType(init.data_type, tuple(int(d) for d in init.dims))
    for info in [*graph.input, *graph.value_info, *graph.output]:
        found = value_type_of(info)
        if found is not None and (info.name not in types or types[info.name].shape is None):
            types[info.name] = found
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
            for attribute in node.attribute:
                if attribute.name == "value":
                    types[node.output[0]] = ValueType(attribute.t.data_type, tuple(int(d) for d in attribute.t.dims))
    return types


def onnx_opset(model: onnx.ModelProto) -> int:
    """The model's ai.onnx opset version.

    Raises:
        ValueError: The model imports no ai.onnx opset.
    """
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise ValueError("the model imports no ai.onnx opset (opset_import has no entry for domain '')")


class GraphEmitter:
    """Collects new nodes and constant initializers for one graph.

    Attributes:
        opset: The ai.onnx opset the emitted nodes must conform to (>= ``MIN_OPSET``).
        nodes: Nodes emitted so far, in emission (hence topological) order.
        initializers: Constants emitted so far.
        types: Static types of values, the model's and those the emitter created.
        ortlstm_ops: Whether rules may emit ops of the ortlstm kernel library where standard ops
            would also do, because they are faster (Conv's gradient as one ``ortlstm::ConvGrad``):
            True for the train step, which runs with the library; False for standard ONNX ops only.
    """

    def __init__(
        self,
        opset: int,
        used: Iterable[str] = (),
        types: dict[str, ValueType] | None = None,
        *,
        ortlstm_ops: bool = True,
    ) -> None:
        if opset < MIN_OPSET:
            raise ValueError(
                f"ai.onnx opset {opset} is older than {MIN_OPSET}, the oldest the training-graph builders support; "
                "convert the model first (onnx.version_converter.convert_version(model, 17)) or re-export it with "
                "opset_version>=13"
            )
        self.opset = opset
        self.ortlstm_ops = ortlstm_ops
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.types: dict[str, ValueType] = dict(types or {})
        self._used = set(used)
        self._values: dict[str, np.ndarray] = {}
        self._constants: dict[tuple[bytes, int, tuple[int, ...]], str] = {}
        self._shapes: dict[str, str] = {}

    # ---- names -------------------------------------------------------------------------------

    def fresh(self, base: str) -> str:
        """A name used nowhere in the graph, derived from ``base``."""
        return unique_name(base or "v", self._used)

    def reserve(self, names: Iterable[str]) -> None:
        """Marks names as taken (values added to the graph by other means)."""
        self._used.update(names)

    # ---- nodes -------------------------------------------------------------------------------

    def op(
        self,
        op_type: str,
        inputs: Sequence[str | None],
        *,
        outputs: int | Sequence[str] = 1,
        domain: str = "",
        name: str | None = None,
        attribute_protos: Iterable[onnx.AttributeProto] = (),
        **attributes: Any,
    ) -> str:
        """Emits one node and returns its first output's name (``op_multi`` returns all; its arguments)."""
        return self.op_multi(
            op_type, inputs, outputs=outputs, domain=domain, name=name, attribute_protos=attribute_protos, **attributes
        )[0]

    def op_multi(
        self,
        op_type: str,
        inputs: Sequence[str | None],
        *,
        outputs: int | Sequence[str] = 1,
        domain: str = "",
        name: str | None = None,
        attribute_protos: Iterable[onnx.AttributeProto] = (),
        **attributes: Any,
    ) -> list[str]:
        """Emits one node and returns all its output names.

        Args:
            op_type: The op type.
            inputs: Value names; None or "" for an absent optional input.
            outputs: The number of outputs (named freshly) or their names.
            domain: The op's domain.
            name: The node's name; derived from ``op_type`` when omitted.
            attribute_protos: Attributes copied as they are (a forward node's, onto its gradient
                op), after ``attributes``, before the node is checked against its schema.
            **attributes: Node attributes; None values are left out.

        Raises:
            checks.NodeSchemaError: The node does not fit its op's schema (an unknown op, a wrong
                count of inputs or outputs, an attribute the op lacks or of another type).
        """
        if isinstance(outputs, int):
            output_names = [self.fresh(f"{op_type}_out") for _ in range(outputs)]
        else:
            output_names = list(outputs)
            self.reserve(output_names)
        input_names = [value or "" for value in inputs]
        node_name = self.fresh(name or op_type)
        node = onnx.helper.make_node(
            op_type,
            input_names,
            output_names,
            name=node_name,
            domain=domain,
            **{key: value for key, value in attributes.items() if value is not None},
        )
        node.attribute.extend(attribute_protos)
        # The check reads the parts at hand rather than the proto (a field read costs as much as the check).
        attribute_types = [(a.name, a.type) for a in node.attribute] if attributes or attribute_protos else []
        check_parts(domain, op_type, node_name, input_names, output_names, attribute_types, self.opset)
        self.nodes.append(node)
        return output_names

    # ---- constants ---------------------------------------------------------------------------

    def constant(self, value: object, elem_type: int, *, name: str = "const") -> str:
        """A constant initializer of the given ONNX element type; equal constants are shared."""
        array = np.asarray(value, dtype=onnx.helper.tensor_dtype_to_np_dtype(elem_type))
        key = (array.tobytes(), elem_type, array.shape)
        if key not in self._constants:
            tensor = onnx.numpy_helper.from_array(array, self.fresh(name))
            self.initializers.append(tensor)
            self._constants[key] = tensor.name
            self._values[tensor.name] = array
            self.types[tensor.name] = ValueType(elem_type, tuple(array.shape))
        return self._constants[key]

    def record_constants(self, initializers: Iterable[onnx.TensorProto], max_elements: int = 1024) -> None:
        """Makes the values of small integer initializers (bounds, axes, shapes) known to rules.

        Float initializers are left out on purpose: they may be parameters, whose values change.
        """
        for init in initializers:
            if (
                init.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
                and np.prod(init.dims) <= max_elements
            ):
                self._values[init.name] = onnx.numpy_helper.to_array(init)

    def constant_value(self, name: str) -> np.ndarray | None:
        """The value of a constant known to be fixed (see ``record_constants``), else None."""
        return self._values.get(name)

    def ints(self, values: Sequence[int] | int) -> str:
        """An int64 constant (axes, shapes, indices): 1-D for a sequence, 0-D for an int."""
        return self.constant(values, onnx.TensorProto.INT64, name="ints")

    def scalar_like(self, value: float, like: str) -> str:
        """A 0-D constant of ``like``'s element type (a CastLike node when that type is unknown)."""
        elem_type = self.elem_type(like)
        if elem_type:
            return self.constant(value, elem_type, name="scalar")
        return self.op("CastLike", [self.constant(value, onnx.TensorProto.DOUBLE, name="scalar"), like])

    # ---- what is known of values -------------------------------------------------------------

    def value_type(self, name: str) -> ValueType | None:
        """Static type of a value, if known."""
        return self.types.get(name)

    def elem_type(self, name: str) -> int:
        """Element type of a value, 0 when unknown."""
        found = self.types.get(name)
        return found.elem_type if found is not None else 0

    def rank(self, name: str) -> int | None:
        """Rank of a value, when known."""
        found = self.types.get(name)
        return found.rank if found is not None else None

    def static_shape(self, name: str) -> tuple[int, ...] | None:
        """Shape of a value when every dim is a known integer."""
        found = self.types.get(name)
        return found.static_shape if found is not None else None

    def set_type(self, name: str, elem_type: int, shape: Sequence[int | str | None] | None) -> None:
        """Records what a builder knows of a value it created."""
        self.types[name] = ValueType(elem_type, None if shape is None else tuple(shape))

    def shape(self, name: str) -> str:
        """The value's shape as a 1-D int64 tensor: a constant when static, else one Shape node per value."""
        static = self.static_shape(name)
        if static is not None:
            return self.ints(list(static))
        if name not in self._shapes:
            self._shapes[name] = self.op("Shape", [name])
        return self._shapes[name]

    # ---- ops whose signature depends on the opset --------------------------------------------

    def reduce(self, op_type: str, data: str, axes: Sequence[int] | str | None, *, keepdims: bool) -> str:
        """ReduceSum/ReduceMean/ReduceMax/... over ``axes`` (a list, a 1-D int64 value, or None = all axes)."""
        axes_as_input = (op_type == "ReduceSum" and self.opset >= 13) or self.opset >= 18
        if axes is None:
            return self.op(op_type, [data], keepdims=int(keepdims))
        if isinstance(axes, str):
            if not axes_as_input:
                raise ValueError(f"{op_type} with run-time axes needs ai.onnx opset >= 18, the model has {self.opset}")
            return self.op(op_type, [data, axes], keepdims=int(keepdims), noop_with_empty_axes=1)
        if not axes:
            return data
        if axes_as_input:
            return self.op(op_type, [data, self.ints(list(axes))], keepdims=int(keepdims))
        return self.op(op_type, [data], axes=list(axes), keepdims=int(keepdims))

    def reduce_sum(self, data: str, axes: Sequence[int] | str | None, *, keepdims: bool) -> str:
        """ReduceSum over ``axes``; see ``reduce``."""
        return self.reduce("ReduceSum", data, axes, keepdims=keepdims)

    def unsqueeze(self, data: str, axes: Sequence[int]) -> str:
        """Unsqueeze (axes an input from opset 13, the oldest supported)."""
        return self.op("Unsqueeze", [data, self.ints(list(axes))])

    def squeeze(self, data: str, axes: Sequence[int] | None = None) -> str:
        """Squeeze (axes an input from opset 13); None squeezes every size-1 axis."""
        return self.op("Squeeze", [data] if axes is None else [data, self.ints(list(axes))])

    def sum(self, values: Sequence[str]) -> str:
        """The sum of values of one shape: the value itself when there is one."""
        if len(values) == 1:
            return values[0]
        return self.op("Sum", list(values))

    def unbroadcast(self, grad: str, like: str, grad_shape_of: str | None = None) -> str:
        """Sums ``grad`` (the gradient of a broadcast result) down to the shape of input ``like``.

        numpy broadcasting: leading axes that ``like`` lacks are summed away, then every axis where
        ``like`` has size 1 and the result does not. When the static types tell which axes those are
        (see ``_unbroadcast_axes``; a dynamic batch dim shared by both sides does not prevent it)
        this is a fixed ReduceSum and Squeeze (or nothing); otherwise the axes are computed at run time.

        Args:
            grad: Gradient with the broadcast result's shape.
            like: The input the gradient belongs to.
            grad_shape_of: A value with ``grad``'s shape whose static type may be known (e.g. the
                node's output), used when ``grad`` itself has no recorded type.
        """
        reference = grad_shape_of or grad
        axes = self._unbroadcast_axes(like, reference, grad)
        if axes is not None:
            lead, summed = axes
            if not summed:
                return grad
            if len(summed) == lead:  # only leading axes: one ReduceSum drops them
                return self.reduce_sum(grad, summed, keepdims=False)
            reduced = self.reduce_sum(grad, summed, keepdims=True)
            return self.squeeze(reduced, list(range(lead))) if lead else reduced
        # Run time: pad like's shape with leading ones to the result's rank, sum where it is 1.
        grad_shape = self.op("Shape", [grad])
        like_shape_value = self.shape(like)
        rank_gap = self.op("Sub", [self.op("Size", [grad_shape]), self.op("Size", [like_shape_value])])
        ones = self.op("Expand", [self.ints([1]), self.op("Reshape", [rank_gap, self.ints([1])])])
        padded_shape = self.op("Concat", [ones, like_shape_value], axis=0)
        is_broadcast = self.op(
            "And",
            [
                self.op("Equal", [padded_shape, self.ints(1)]),
                self.op("Not", [self.op("Equal", [grad_shape, self.ints(1)])]),
            ],
        )
        broadcast_axes = self.op("Reshape", [self.op("NonZero", [is_broadcast]), self.ints([-1])])
        reduced = self.op("ReduceSum", [grad, broadcast_axes], keepdims=1, noop_with_empty_axes=1)
        return self.op("Reshape", [reduced, like_shape_value])

    def _unbroadcast_axes(self, like: str, *results: str) -> tuple[int, list[int]] | None:
        """(leading axes to drop, axes to sum) turning a broadcast result into ``like``, if static types tell.

        An axis is summed where ``like`` has size 1 (harmless when the result's is 1 too) and kept
        where ``like``'s size is a known integer other than 1 or the same symbol as the result's;
        any other pair (an unknown dim of ``like``) could be a broadcast or not: None.
        """
        like_value = self.value_type(like)
        out_shape = next(
            (found.shape for found in map(self.value_type, results) if found and found.shape is not None), None
        )
        if like_value is None or like_value.shape is None or out_shape is None:
            return None
        lead = len(out_shape) - len(like_value.shape)
        if lead < 0:
            return None
        summed = list(range(lead))
        for axis, (like_dim, out_dim) in enumerate(zip(like_value.shape, out_shape[lead:], strict=True), start=lead):
            if like_dim == 1:
                if out_dim != 1:
                    summed.append(axis)
            elif not (isinstance(like_dim, int) or (isinstance(like_dim, str) and like_dim == out_dim)):
                return None
        return lead, summed


def make_model(
    graph: onnx.GraphProto,
    opset_imports: Sequence[onnx.OperatorSetIdProto],
    *,
    ir_version: int,
    functions: Sequence[onnx.FunctionProto] = (),
) -> onnx.ModelProto:
    """A model with the given opsets and IR version (the runtime asked for decides the IR)."""
    model = onnx.helper.make_model(graph, opset_imports=list(opset_imports), functions=list(functions))
    model.ir_version = ir_version
    return model
