"""The op contract of ortlstm: every op declared once, as plain data.

This module is the single source of truth for op names, port order, shapes and attributes.
The C++ header, docs/ops.md, the onnx OpSchema registration and the NumPy reference all read it;
nothing else in the repository spells out a port name or index by hand. It must stay pure data
(standard library only, no onnx or onnxruntime) so that every layer can import it cheaply.
Changing the order or meaning of a port requires bumping the op's version.

The declarations live in the modules beside it, one family each: ``contract`` (what a declaration
is made of), ``spec_lstm``, ``spec_gru``, ``spec_rnn``, ``wiring`` (gradient ops to forward nodes),
``spec_optimizers``, ``spec_ctc`` and ``spec_gradients``, each with its ``Family`` record (``family``: what
codegen and onnx_defs read of a family). This module gathers them: every layer reads ``ortlstm.ops.schema``.
"""

from __future__ import annotations

from ortlstm.ops.contract import (  # noqa: F401 - the contract, gathered
    ACTIVATIONS,
    BLAS_DIM_LIMIT,
    DIM_DOCS,
    DIRECTIONS,
    DOMAIN,
    MAX_BUFFER_ELEMENTS,
    MAX_HIDDEN_SIZE,
    OPSET_VERSION,
    AttrSpec,
    AttrType,
    AttrValue,
    OpSpec,
    PortSpec,
    TypeConstraintSpec,
    attribute,
    attribute_names,
    input_index,
    input_names,
    num_directions,
    output_index,
    output_names,
    parse_dim,
    shape_for_layout,
)
from ortlstm.ops.family import (  # noqa: F401 - the contract, gathered
    AxisOf,
    Family,
    InputFlag,
    OutputShape,
)
from ortlstm.ops.spec_ctc import (  # noqa: F401 - the contract, gathered
    CTC_FAMILY,
    CTC_LOSS,
    CTC_LOSS_GRAD,
    CTC_OPS,
)
from ortlstm.ops.spec_gradients import (  # noqa: F401 - the contract, gathered
    CONV_GRAD,
    GRADIENT_FAMILY,
    GRADIENT_OPS,
    SIGMOID_GRAD,
    TANH_GRAD,
)
from ortlstm.ops.spec_gru import (  # noqa: F401 - the contract, gathered
    GRU_FAMILY,
    GRU_GRAD,
    GRU_OPS,
    GRU_TRAINING,
)
from ortlstm.ops.spec_lstm import (  # noqa: F401 - the contract, gathered
    LSTM_FAMILY,
    LSTM_GRAD,
    LSTM_TRAINING,
    OPS,
)
from ortlstm.ops.spec_optimizers import (  # noqa: F401 - the contract, gathered
    ADAM_UPDATE,
    OPTIMIZER_FAMILY,
    OPTIMIZER_OPS,
    SGD_UPDATE,
    SHAPE_AS_PARAM,
)
from ortlstm.ops.spec_rnn import (  # noqa: F401 - the contract, gathered
    RNN_FAMILY,
    RNN_GRAD,
    RNN_OPS,
    RNN_TRAINING,
)
from ortlstm.ops.wiring import (  # noqa: F401 - the contract, gathered
    GRU_TRAINING_GRADIENT,
    LSTM_TRAINING_GRADIENT,
    RNN_TRAINING_GRADIENT,
    GradientLink,
    GradientSource,
    GradientWiring,
    gradient_wiring,
)

FAMILIES: tuple[Family, ...] = (
    LSTM_FAMILY,
    GRU_FAMILY,
    RNN_FAMILY,
    OPTIMIZER_FAMILY,
    CTC_FAMILY,
    GRADIENT_FAMILY,
)
"""Every op family, in documentation order: what codegen and onnx_defs iterate (a new family is one entry)."""

ALL_OPS: tuple[OpSpec, ...] = tuple(op for family in FAMILIES for op in family.ops)
"""Every op of the domain, in documentation order: what the graph code iterates."""

SHARED_ATTRIBUTES: tuple[AttrSpec, ...] = LSTM_TRAINING.attributes
"""The attributes of the header's shared ``attr::`` namespace (a family names them in ``shared_attributes``)."""


def family_of(op: OpSpec) -> Family:
    """Returns the family that declares ``op``.

    Raises:
        KeyError: If no family declares it.
    """
    for family in FAMILIES:
        if op in family.ops:
            return family
    raise KeyError(f"op {op.name!r} is in no family of {[family.name for family in FAMILIES]}")


def op_by_name(name: str) -> OpSpec:
    """Returns the spec of op type ``name`` in ``DOMAIN``.

    Raises:
        KeyError: If no op of that name is declared.
    """
    for op in ALL_OPS:
        if op.name == name:
            return op
    raise KeyError(f"no op {name!r} in domain {DOMAIN!r}; ops are {[op.name for op in ALL_OPS]}")


