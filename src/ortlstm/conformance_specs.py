"""The conformance cases of ``ortlstm.conformance`` as data: one ``CaseSpec`` per case, by op family.

Split out of conformance.py (which generates, loads and runs the cases) so that each recurrent family's
cases sit together and neither module grows past the project's file size. ``FAMILIES`` names, per family,
the ops a case builds, the stash a grad node reads and the reference function that computes that stash.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ortlstm.ops import schema


@dataclasses.dataclass(frozen=True)
class Family:
    """One recurrent op family's ops, as the conformance cases use them.

    Attributes:
        training: The forward op (LSTMTraining, GRUTraining).
        grad: Its gradient op.
        stash: The forward outputs the gradient op reads besides the forward inputs.
        stash_from: ``module:function`` of the reference that computes the stash (a ``"node"`` case's
            inputs), imported when a case is generated.
    """

    training: schema.OpSpec
    grad: schema.OpSpec
    stash: tuple[str, ...]
    stash_from: str

    @property
    def forward_inputs(self) -> tuple[str, ...]:
        """The training op's input ports."""
        return schema.input_names(self.training)

    @property
    def forward_outputs(self) -> tuple[str, ...]:
        """The training op's output ports."""
        return schema.output_names(self.training)

    @property
    def upstream_gradients(self) -> tuple[str, ...]:
        """The gradient op's inputs that carry the loss's gradient of a forward output."""
        return tuple(port.name for port in self.grad.inputs if port.gradient_of in self.forward_outputs)


FAMILIES: dict[str, Family] = {
    "LSTM": Family(schema.LSTM_TRAINING, schema.LSTM_GRAD, ("HAll", "CAll", "IOFC"), "ortlstm.reference:lstm_training"),
    "GRU": Family(schema.GRU_TRAINING, schema.GRU_GRAD, ("HAll", "ZRH"), "ortlstm.reference_gru:gru_training_op"),
    "RNN": Family(schema.RNN_TRAINING, schema.RNN_GRAD, ("HAll",), "ortlstm.reference_rnn:rnn_training_op"),
}
"""Op family (``CaseSpec.op``) -> its ops."""

_TRAINING = schema.LSTM_TRAINING
_GRAD = schema.LSTM_GRAD
_STASH = FAMILIES["LSTM"].stash
_FORWARD_INPUTS = schema.input_names(_TRAINING)
_ALL_FORWARD_OUTPUTS = schema.output_names(_TRAINING)
_ALL_GRAD_OUTPUTS = schema.output_names(_GRAD)


@dataclasses.dataclass(frozen=True)
class CaseSpec:
    """One conformance case, as data (the LSTM's ports by default; a GRU case names its own).

    Attributes:
        name: Case name without the ``test_ortlstm_`` prefix and the dtype suffix.
        doc: What the case checks (the model's doc_string).
        dims: (seq_length, batch_size, input_size, hidden_size).
        attributes: Node attributes (both nodes of a chained case share them).
        inputs: Present inputs of the first node, by port name.
        outputs: Present outputs of the first node that are graph outputs, by port name.
        grad: ``""``: LSTMTraining alone; ``"node"``: LSTMGrad alone, the stash fed as graph
            inputs (computed by the reference); ``"chained"``: LSTMTraining feeding LSTMGrad.
        grad_inputs: Present inputs of LSTMGrad, by port name (stash ports included).
        grad_outputs: Present outputs of LSTMGrad, by port name.
        sequence_lens: Values of sequence_lens, when it is an input.
        op: The op family, a key of ``FAMILIES``.
    """

    name: str
    doc: str
    dims: tuple[int, int, int, int]
    attributes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    inputs: tuple[str, ...] = ("X", "W", "R")
    outputs: tuple[str, ...] = _ALL_FORWARD_OUTPUTS
    grad: str = ""
    grad_inputs: tuple[str, ...] = ()
    grad_outputs: tuple[str, ...] = _ALL_GRAD_OUTPUTS
    sequence_lens: tuple[int, ...] | None = None
    op: str = "LSTM"

    @property
    def family(self) -> Family:
        """The case's ops (``FAMILIES[op]``)."""
        return FAMILIES[self.op]


_ALL_INPUTS = _FORWARD_INPUTS
_GRAD_ALL_INPUTS = schema.input_names(_GRAD)
_COM_MICROSOFT_INPUTS = tuple(name for name in _GRAD_ALL_INPUTS if name != "P")  # its 12 inputs
_PER_ACTIVATION = {  # alpha and beta for every activation, as other exporters write them
    "activations": ["HardSigmoid", "ScaledTanh", "Affine", "LeakyRelu", "Elu", "ThresholdedRelu"],
    "activation_alpha": [0.3, 1.2, 0.8, 0.2, 0.7, 0.1],
    "activation_beta": [0.45, 0.6, 0.1, 9.0, 9.0, 9.0],
}

LSTM_SPECS: tuple[CaseSpec, ...] = (
    CaseSpec("training_defaults", "Only X, W, R; default attributes; every output.", (3, 2, 3, 2)),
    CaseSpec(
        "training_all_inputs",
        "B, initial_h, initial_c and peepholes P.",
        (3, 2, 3, 3),
        inputs=("X", "W", "R", "B", "initial_h", "initial_c", "P"),
    ),
    CaseSpec(
        "training_reverse_sequence_lens",
        "direction=reverse with sequence_lens 3, 0, 1: a length-0 entry gives zero outputs, Ht and Ct.",
        (3, 3, 2, 2),
        {"direction": "reverse"},
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c"),
        sequence_lens=(3, 0, 1),
    ),
    CaseSpec(
        "training_bidirectional_layout1",
        "direction=bidirectional, layout=1 (batch first), sequence_lens with a zero, peepholes.",
        (3, 3, 2, 2),
        {"direction": "bidirectional", "layout": 1},
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
        sequence_lens=(2, 0, 3),
    ),
    CaseSpec(
        "training_layout1",
        "layout=1, forward, initial state.",
        (2, 3, 2, 3),
        {"layout": 1},
        inputs=("X", "W", "R", "B", "initial_h", "initial_c"),
    ),
    CaseSpec(
        "training_clip_input_forget",
        "clip=0.5 (gate pre-activations clamped) and input_forget=1 (f = 1 - i), peepholes.",
        (3, 2, 3, 2),
        {"clip": 0.5, "input_forget": 1},
        inputs=("X", "W", "R", "B", "initial_c", "P"),
    ),
    CaseSpec(
        "training_activations_per_activation_alpha_beta",
        "Bidirectional, six parametrized activations, activation_alpha and activation_beta with one value per "
        "activation (onnxruntime's LSTM takes them in order, each activation the next value of the lists it reads, "
        "and ignores the surplus).",
        (2, 2, 2, 2),
        {"direction": "bidirectional", **_PER_ACTIVATION},
        inputs=("X", "W", "R", "B", "initial_h", "initial_c"),
    ),
    CaseSpec(
        "training_activations_defaults_any_case",
        "Activation names in any case; alpha/beta lists shorter than the activations that read them (the rest take "
        "the defaults).",
        (2, 2, 2, 2),
        {
            "direction": "bidirectional",
            "activations": ["sigmoid", "SOFTSIGN", "Softplus", "HardSigmoid", "relu", "LeakyRelu"],
            "activation_alpha": [0.25],
        },
        inputs=("X", "W", "R", "B", "initial_h", "initial_c"),
    ),
    CaseSpec(
        "training_activations_csv_only",
        "Activations given only as activations_csv (onnxruntime older than 1.25 cannot pass string lists).",
        (2, 2, 2, 2),
        {"activations_csv": "Sigmoid,Tanh,Softsign"},
        inputs=("X", "W", "R", "B"),
    ),
    CaseSpec(
        "training_omitted_outputs_ht",
        "Only Ht: outputs HAll omitted (empty name), the rest trailing.",
        (3, 2, 2, 2),
        inputs=("X", "W", "R", "B"),
        outputs=("Ht",),
    ),
    CaseSpec(
        "training_omitted_outputs_hall_ct",
        "HAll and Ct only; Ht omitted in the middle.",
        (2, 2, 2, 2),
        inputs=("X", "W", "R", "B", "initial_h"),
        outputs=("HAll", "Ct"),
    ),
    CaseSpec(
        "training_omitted_middle_inputs",
        "B, sequence_lens and initial_h omitted in the middle (empty names), initial_c and P given.",
        (2, 2, 3, 2),
        inputs=("X", "W", "R", "initial_c", "P"),
    ),
    CaseSpec("training_t1_batch1", "seq_length 1, batch_size 1.", (1, 1, 3, 2), inputs=("X", "W", "R", "B")),
    CaseSpec(
        "training_size1",
        "input_size 1 and hidden_size 1, bidirectional.",
        (2, 2, 1, 1),
        {"direction": "bidirectional"},
        inputs=("X", "W", "R", "B", "P"),
    ),
    CaseSpec(
        "grad_all_inputs",
        "LSTMGrad alone, every input, the stash from LSTMTraining; every output.",
        (3, 2, 3, 2),
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
        grad="node",
        grad_inputs=_GRAD_ALL_INPUTS,
        sequence_lens=(3, 2),
    ),
    CaseSpec(
        "grad_com_microsoft_inputs",
        "The 12 inputs of com.microsoft LSTMGrad, in its order (no P): the drop-in form.",
        (3, 2, 2, 2),
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c"),
        grad="node",
        grad_inputs=_COM_MICROSOFT_INPUTS,
        sequence_lens=(3, 1),
    ),
    CaseSpec(
        "grad_only_ht_omitted_outputs",
        "Only grad_Ht, no initial state; only dW and dR requested.",
        (3, 2, 2, 2),
        inputs=("X", "W", "R", "B"),
        grad="node",
        grad_inputs=("X", "W", "R", *_STASH, "grad_Ht"),
        grad_outputs=("dW", "dR"),
    ),
    CaseSpec(
        "grad_bidirectional_layout1_sequence_lens",
        "Bidirectional, layout=1, sequence_lens with a zero, peepholes.",
        (3, 3, 2, 2),
        {"direction": "bidirectional", "layout": 1},
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
        grad="node",
        grad_inputs=_GRAD_ALL_INPUTS,
        sequence_lens=(0, 3, 2),
    ),
    CaseSpec(
        "grad_t1_batch1_reverse",
        "seq_length 1, batch_size 1, reverse.",
        (1, 1, 2, 3),
        {"direction": "reverse"},
        inputs=("X", "W", "R", "B", "initial_h", "initial_c"),
        grad="node",
        grad_inputs=_COM_MICROSOFT_INPUTS,
        sequence_lens=(1,),
    ),
    CaseSpec(
        "chained_clip_peephole_bidirectional",
        "LSTMTraining feeding LSTMGrad in one graph: clip, peepholes, bidirectional, sequence_lens with a zero.",
        (3, 3, 2, 2),
        {"direction": "bidirectional", "clip": 0.6},
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
        outputs=("HAll", "Ht", "Ct"),
        grad="chained",
        grad_inputs=_GRAD_ALL_INPUTS,
        sequence_lens=(3, 0, 2),
    ),
    CaseSpec(
        "chained_activations_input_forget_layout1",
        "LSTMTraining feeding LSTMGrad: per-activation alpha/beta lists, input_forget, layout=1, reverse.",
        (3, 2, 2, 2),
        {
            "direction": "reverse",
            "layout": 1,
            "input_forget": 1,
            "activations": ["HardSigmoid", "Softsign", "Elu"],
            "activation_alpha": [0.3, 0.8, 0.5],
            "activation_beta": [0.45, 1.0, 1.0],
        },
        inputs=("X", "W", "R", "B", "initial_h", "initial_c"),
        outputs=("Ht",),
        grad="chained",
        grad_inputs=("X", "W", "R", "initial_h", "initial_c", *_STASH, "grad_HAll", "grad_Ht"),
    ),
)
"""The LSTM's cases."""

_GRU_OUTPUTS = schema.output_names(schema.GRU_TRAINING)
_GRU_GRAD_INPUTS = schema.input_names(schema.GRU_GRAD)
_GRU_GRAD_OUTPUTS = schema.output_names(schema.GRU_GRAD)
_GRU: dict[str, Any] = {"op": "GRU", "outputs": _GRU_OUTPUTS, "grad_outputs": _GRU_GRAD_OUTPUTS}
GRU_SPECS: tuple[CaseSpec, ...] = (
    CaseSpec(
        "gru_training_defaults",
        "GRUTraining: only X, W, R; default attributes; every output.",
        (3, 2, 3, 2),
        **_GRU,
    ),
    CaseSpec(
        "gru_training_linear_before_reset_all_inputs",
        "GRUTraining as torch exports nn.GRU: linear_before_reset=1, B, initial_h.",
        (3, 2, 3, 3),
        {"linear_before_reset": 1},
        inputs=("X", "W", "R", "B", "initial_h"),
        **_GRU,
    ),
    CaseSpec(
        "gru_training_bidirectional_layout1_sequence_lens",
        "GRUTraining: bidirectional, layout=1, clip, sequence_lens with a zero (zero outputs and Ht there).",
        (3, 3, 2, 2),
        {"direction": "bidirectional", "layout": 1, "clip": 0.9},
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h"),
        sequence_lens=(2, 0, 3),
        **_GRU,
    ),
    CaseSpec(
        "gru_training_activations_reverse_only_ht",
        "GRUTraining: per-activation alpha/beta (HardSigmoid, ScaledTanh), reverse, only Ht requested.",
        (3, 2, 2, 2),
        {
            "direction": "reverse",
            "activations": ["HardSigmoid", "ScaledTanh"],
            "activation_alpha": [0.3, 1.2],
            "activation_beta": [0.45, 0.6],
        },
        inputs=("X", "W", "R", "B"),
        **{**_GRU, "outputs": ("Ht",)},
    ),
    CaseSpec(
        "gru_grad_all_inputs",
        "GRUGrad alone, its ten inputs in com.microsoft GRUGrad's order, the stash from GRUTraining; every output.",
        (3, 2, 3, 2),
        {"linear_before_reset": 1},
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h"),
        grad="node",
        grad_inputs=_GRU_GRAD_INPUTS,
        sequence_lens=(3, 1),
        **_GRU,
    ),
    CaseSpec(
        "gru_grad_only_ht_omitted_outputs",
        "GRUGrad: only grad_Ht, no B or initial state; only dW and dR requested.",
        (3, 2, 2, 2),
        inputs=("X", "W", "R"),
        grad="node",
        grad_inputs=("X", "W", "R", "HAll", "ZRH", "grad_Ht"),
        **{**_GRU, "grad_outputs": ("dW", "dR")},
    ),
    CaseSpec(
        "gru_chained_bidirectional_clip_sequence_lens",
        "GRUTraining feeding GRUGrad in one graph: bidirectional, clip, sequence_lens with a zero, layout=1.",
        (3, 3, 2, 2),
        {"direction": "bidirectional", "clip": 0.6, "layout": 1},
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h"),
        outputs=("HAll", "Ht"),
        grad="chained",
        grad_inputs=_GRU_GRAD_INPUTS,
        sequence_lens=(3, 0, 2),
        op="GRU",
        grad_outputs=_GRU_GRAD_OUTPUTS,
    ),
)
"""The GRU's cases."""

_RNN_GRAD_INPUTS = schema.input_names(schema.RNN_GRAD)
_RNN: dict[str, Any] = {
    "op": "RNN",
    "outputs": schema.output_names(schema.RNN_TRAINING),
    "grad_outputs": schema.output_names(schema.RNN_GRAD),
}
RNN_SPECS: tuple[CaseSpec, ...] = (
    CaseSpec(
        "rnn_training_defaults",
        "RNNTraining: only X, W, R; default attributes (Tanh); every output.",
        (3, 2, 3, 2),
        **_RNN,
    ),
    CaseSpec(
        "rnn_training_relu_all_inputs",
        "RNNTraining as torch exports nn.RNN(nonlinearity='relu'): Relu, B, initial_h.",
        (3, 2, 3, 3),
        {"activations": ["Relu"]},
        inputs=("X", "W", "R", "B", "initial_h"),
        **_RNN,
    ),
    CaseSpec(
        "rnn_training_bidirectional_layout1_sequence_lens",
        "RNNTraining: bidirectional (Tanh, ScaledTanh with alpha/beta), layout=1, clip, sequence_lens with a zero.",
        (3, 3, 2, 2),
        {
            "direction": "bidirectional",
            "layout": 1,
            "clip": 0.9,
            "activations": ["Tanh", "ScaledTanh"],
            "activation_alpha": [1.2],
            "activation_beta": [0.6],
        },
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h"),
        sequence_lens=(2, 0, 3),
        **_RNN,
    ),
    CaseSpec(
        "rnn_grad_all_inputs",
        "RNNGrad alone, its nine inputs, HAll from RNNTraining; reverse; every output.",
        (3, 2, 3, 2),
        {"direction": "reverse"},
        inputs=("X", "W", "R", "B", "sequence_lens", "initial_h"),
        grad="node",
        grad_inputs=_RNN_GRAD_INPUTS,
        sequence_lens=(3, 1),
        **_RNN,
    ),
    CaseSpec(
        "rnn_chained_bidirectional_relu_clip_only_ht",
        "RNNTraining feeding RNNGrad in one graph: bidirectional Relu, clip, only grad_Ht; only dW, dR, dB.",
        (3, 2, 2, 2),
        {"direction": "bidirectional", "clip": 1.1, "activations": ["Relu", "Relu"]},
        inputs=("X", "W", "R", "B", "initial_h"),
        grad="chained",
        grad_inputs=("X", "W", "R", "B", "initial_h", "HAll", "grad_Ht"),
        **{**_RNN, "outputs": ("Ht",), "grad_outputs": ("dW", "dR", "dB")},
    ),
)
"""The RNN's cases."""

SPECS: tuple[CaseSpec, ...] = LSTM_SPECS + GRU_SPECS + RNN_SPECS
"""Every case, each generated in float32 and float64."""
