"""The train-step model: forward, loss, backward and optimizer update in one ONNX model.

``build_training_models`` turns an exported model into the models a trainer runs with any
``onnxruntime.InferenceSession`` (the newest plain onnxruntime and onnxruntime-training 1.19.2's
alike; no training build, no torch):

- ``train_step``: inputs are the batch, the target (and a loss's other targets: ctc_loss's
  lengths), the parameters, the optimizer state, ``lr`` and ``step``; outputs are the loss, the
  requested extra outputs, the updated parameters and state (and the total gradient norm when
  clipping).
- ``eval``: the same forward and loss with training-mode Dropout off, parameters as inputs.
- ``gradients`` and ``apply``: the step split in two, for gradient accumulation over batches.

The signature (``TrainStepSignature``) names every input and output, so nothing downstream
guesses names. Protos only; nothing here imports onnxruntime.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from ortlstm.graphs import losses as losses_module
from ortlstm.graphs import optimizers as optimizers_module
from ortlstm.graphs.autodiff import GraphEmitter, build_backward, infer_value_types, onnx_opset
from ortlstm.graphs.emit.checks import make_checked_node
from ortlstm.graphs.emit.emitter import ValueType
from ortlstm.graphs.emit.graph_utils import prune_to_outputs, used_names
from ortlstm.graphs.finite_check import FiniteCheck, add_finite_check
from ortlstm.graphs.optimizers import base as optimizer_base
from ortlstm.graphs.optimizers.clip import clip_settings
from ortlstm.graphs.options import BUILDER_DEFAULTS
from ortlstm.graphs.param_selection import choose_params, default_requires_grad
from ortlstm.graphs.parameters import ParameterNames
from ortlstm.graphs.precision import matmul_precision, set_matmul_precision
from ortlstm.graphs.prepare import prepare_model
from ortlstm.graphs.prepare.fixed_dims import record_export_dims
from ortlstm.graphs.prepare.torch_folds import check_trained, zero_padding_gradients
from ortlstm.graphs.signature import TrainingModels, TrainStepSignature
from ortlstm.ops import schema as ortlstm_schema

LR_INPUT = "lr"
STEP_INPUT = "step"

__all__ = ["LR_INPUT", "STEP_INPUT", "TrainStepSignature", "TrainingModels", "build_training_models", "clip_settings"]


def _value_info_of(name: str, elem_type: int, shape: Sequence[int | str | None] | None) -> onnx.ValueInfoProto:
    return onnx.helper.make_tensor_value_info(name, elem_type, None if shape is None else list(shape))


def _inferred_info(name: str, types: Mapping[str, ValueType]) -> onnx.ValueInfoProto:
    """A graph output's declaration from inference (the exporter's own is not trusted)."""
    found = types.get(name)
    if found is None or not found.elem_type:
        return onnx.helper.make_empty_tensor_value_info(name)
    return _value_info_of(name, found.elem_type, found.shape)


def _model_outputs(model: onnx.ModelProto) -> list[str]:
    return [output.name for output in model.graph.output]


def _target_elem_type(loss: losses_module.Loss, prediction: object) -> int:
    """The first type ``losses.target_facts`` accepts: class indices (int64), else the prediction's float type."""
    facts = losses_module.target_facts(loss, prediction)  # type: ignore[arg-type]
    assert facts is not None
    return facts.elem_types[0]


def _target_shape(loss: losses_module.Loss, prediction: object, name: str) -> list[str] | None:
    """Symbolic dims of the target: the rank ``losses.target_facts`` says (the prediction's, less a class axis)."""
    declared = losses_module.LOSSES[loss.kind].declared_target
    if declared is not None:
        return declared(prediction, name)[1]  # type: ignore[arg-type]
    facts = losses_module.target_facts(loss, prediction)  # type: ignore[arg-type]
    if facts is None or facts.shape is None:
        return None
    return [f"{name}_dim{axis}" for axis in range(len(facts.shape))]


def _select_prediction(model: onnx.ModelProto, output: str | None) -> str:
    outputs = _model_outputs(model)
    if output is not None:
        if output not in outputs:
            raise ValueError(f"output {output!r} is not an output of the model; its outputs are {outputs}")
        return output
    if len(outputs) != 1:
        raise ValueError(
            f"the model has {len(outputs)} outputs {outputs}: name the one the loss reads (output=..., "
            "or --output on the command line)"
        )
    return outputs[0]


def _set_dropout_training(graph: onnx.GraphProto, training: bool, emitter: GraphEmitter) -> None:
    """Sets every Dropout's training_mode input to a constant (eval: off)."""
    dropouts = [node for node in graph.node if node.op_type == "Dropout" and node.domain in ("", "ai.onnx")]
    if not dropouts:
        return
    flag = emitter.constant(np.asarray(training), onnx.TensorProto.BOOL, name="training_mode")
    if not any(init.name == flag for init in graph.initializer):
        graph.initializer.extend(init for init in emitter.initializers if init.name == flag)
    for node in dropouts:
        while len(node.input) < 3:
            node.input.append("")
        node.input[2] = flag


def _opsets_for(
    opsets: Sequence[onnx.OperatorSetIdProto], nodes: Sequence[onnx.NodeProto]
) -> list[onnx.OperatorSetIdProto]:
    """``opsets``, plus the ortlstm domain if a node uses it and they lack it.

    That happens for the optimizer's AdamUpdate and SGDUpdate nodes in a model without LSTMs.
    """
    result = list(opsets)
    if any(node.domain == ortlstm_schema.DOMAIN for node in nodes) and all(
        entry.domain != ortlstm_schema.DOMAIN for entry in result
    ):
        result.append(onnx.helper.make_opsetid(ortlstm_schema.DOMAIN, ortlstm_schema.OPSET_VERSION))
    return result


def _kernel_gradients(choice: bool | None, optimizer: optimizers_module.Optimizer, forward: onnx.GraphProto) -> bool:
    """``choice``, or when None: whether the train step needs the kernel library anyway."""
    if choice is not None:
        return choice
    fused_update = optimizer.emission is optimizer_base.KERNEL_NODE
    return fused_update or any(node.domain == ortlstm_schema.DOMAIN for node in forward.node)


def build_training_models(
    model: onnx.ModelProto,
    *,
    loss: losses_module.Loss,
    optimizer: optimizers_module.Optimizer,
    requires_grad: Sequence[str] | None = BUILDER_DEFAULTS["requires_grad"],
    frozen: Sequence[str] = BUILDER_DEFAULTS["frozen"],
    output: str | None = BUILDER_DEFAULTS["output"],
    target: str = BUILDER_DEFAULTS["target"],
    extra_outputs: Sequence[str] = BUILDER_DEFAULTS["extra_outputs"],
    param_groups: Sequence[optimizers_module.ParamGroup] = BUILDER_DEFAULTS["param_groups"],
    clip_grad_norm: float | None = BUILDER_DEFAULTS["clip_grad_norm"],
    clip_norm_type: float = BUILDER_DEFAULTS["clip_norm_type"],
    clip_grad_value: float | None = BUILDER_DEFAULTS["clip_grad_value"],
    fixed_inputs: Mapping[str, np.ndarray] | None = BUILDER_DEFAULTS["fixed_inputs"],
    fixed_shapes: Mapping[str, Sequence[int | str | None]] | None = BUILDER_DEFAULTS["fixed_shapes"],
    ir_version: int = BUILDER_DEFAULTS["ir_version"],
    nonfinite_check: bool = BUILDER_DEFAULTS["nonfinite_check"],
    kernel_gradients: bool | None = BUILDER_DEFAULTS["kernel_gradients"],
    precision: str = BUILDER_DEFAULTS["precision"],
) -> TrainingModels:
    """Builds the train-step, eval, gradient and apply models of an exported model.

    Args:
        model: The model as exported (standard ``LSTM`` nodes are converted on the way).
        loss: The loss applied to the prediction (``losses.Loss``); ``Loss(kind="output")`` uses
            the model output itself as the loss.
        optimizer: The optimizer, with torch.optim's semantics (``optimizers.SGD``, ``Adam``, ``AdamW``,
            ``RMSprop``, ``Adagrad``).
        requires_grad: Parameters to train. Default: what torch trains that reaches the loss: with
            a torch export's metadata its parameters (and initializers folded from them), never
            buffers or constants; without metadata every float initializer or Constant tensor
            of rank >= 1 (0-D ones are an exporter's literals). Others stay constants. Named as
            ``frozen`` names them.
        frozen: Names, globs or module prefixes of parameters not to train, matched against
            initializer names and the torch parameters they were folded from
            (``parameters.ParameterNames``, the one resolver of every option here that names parameters).
        output: The model output the loss reads (required when the model has several).
        target: Name of the target input the loss compares the prediction with. A loss that
            reads more targets (ctc_loss's lengths, ``Loss.extra_targets``) gets an input per
            target named as torch names it (``signature.extra_targets``).
        extra_outputs: Model outputs to return from the train step too.
        param_groups: Per-group optimizer overrides (e.g. no weight decay on biases); each group's
            ``params`` named as ``frozen`` names them, among the trained parameters, no parameter in two groups.
        clip_grad_norm: Clip the global gradient norm to this value (torch's clip_grad_norm_).
        clip_norm_type: The norm's type (2.0 or inf).
        clip_grad_value: Clamp every gradient element to ``[-clip_grad_value, clip_grad_value]``
            (torch's clip_grad_value_), finite and > 0. Not together with ``clip_grad_norm``.
        fixed_inputs: Inputs fixed for training (they become constants; may choose If branches).
        fixed_shapes: Input shapes fixed for training, an int or None (keep) per axis; ``If``
            conditions computed from those dims fold (``prepare_model``). The training models
            then take inputs of these shapes only.
        ir_version: The IR version of the written models (10: onnxruntime >= 1.19 loads them).
        nonfinite_check: Give the train-step and apply models the bool output
            ``signature.all_finite`` (see ``finite_check``), which a trainer reads to refuse an
            update computed from a non-finite loss or gradient. False leaves it out (to measure
            what it costs).
        kernel_gradients: Whether the gradients of Conv, Sigmoid and Tanh are the kernel
            library's ops (``ConvGrad``, ``SigmoidGrad``, ``TanhGrad``) rather than standard ops.
            None: when the train step needs the library anyway (an LSTM, or a fused optimizer
            update), so that a train step that needs none still runs without it. The Trainer,
            which always loads the library, passes True.
        precision: ``"32-true"`` or ``"bf16-mixed"``: every LSTM, GRU and ConvGrad kernel node of the
            models gets ``matmul_precision="bfloat16"`` (``ortlstm.graphs.precision``); parameters,
            optimizer state and every other op stay float32.

    Returns:
        The four models, their signature and the initial parameter and state values.

    Raises:
        ValueError: An unknown output or parameter, a parameter that does not reach the loss,
            an empty set of parameters, an op without gradient rule on a parameter's path, a
            target the loss cannot take.
    """
    clip = clip_settings(clip_grad_norm, clip_norm_type, clip_grad_value)
    matmul_precision(precision)  # refused before any work
    prepared = prepare_model(model, fixed_inputs, fixed_shapes, keep=requires_grad or ())
    if requires_grad is None and prepared.dropped:
        _warn_dropped(prepared.dropped)
    forward = _add_loss(prepared.model, loss, output, target, extra_outputs)
    params = choose_params(prepared, forward.graph, forward.seed, forward.emitter, requires_grad, frozen)
    untrained = [tensor.name for tensor in prepared.model.graph.initializer if tensor.name not in params]
    trained = ParameterNames.of(params, prepared.sources, noun="trained parameter", untrained=untrained)
    param_groups = trained.resolve_groups(param_groups)
    emitter = forward.emitter
    emitter.ortlstm_ops = emitter.ortlstm_ops and _kernel_gradients(kernel_gradients, optimizer, forward.graph)
    check_trained(prepared.notes, prepared.refusals, params)  # what the exporter folded into a trained tensor
    # Backward (rules may name outputs of forward nodes in forward_and_loss).
    first_grad_node = len(emitter.nodes)
    backward = build_backward(
        forward.graph, forward.seed, params, emitter, hints=prepared.control_flow, torch_names=prepared.sources
    )
    grad_nodes = emitter.nodes[first_grad_node:]
    update = _add_update(forward, params, optimizer, param_groups, clip, nonfinite_check)
    # torch's embedding backward gives an nn.Embedding's padding_idx row no gradient (nodes after the update's,
    # read by the links to it).
    first_mask_node = len(emitter.nodes)
    gradients = zero_padding_gradients(emitter, backward.gradients, prepared.padding_rows, forward.model.graph)
    grad_nodes = [*grad_nodes, *emitter.nodes[first_mask_node:]]
    models = _Assembly(forward, params, update, ir_version, (grad_nodes, gradients))
    signature = _signature(forward, params, update, models.batch_inputs, default_requires_grad(prepared))
    initial_params = {name: onnx.numpy_helper.to_array(models.initializers[name]) for name in params}
    initial_state = update.initial_state(initial_params)
    train_step, gradients, apply_model = models.train_step(), models.gradients(), models.apply()
    eval_model = models.eval()  # last: it adds the Dropout flag to the emitter
    for built in (train_step, gradients, apply_model, eval_model):
        set_matmul_precision(built, precision)
    record_export_dims(eval_model, prepared.export_dims)  # the input check names a dim the export fixed
    return TrainingModels(
        train_step, eval_model, gradients, apply_model, signature, initial_params, initial_state, prepared
    )


def _warn_dropped(dropped: Sequence[str]) -> None:
    warnings.warn(
        f"torch parameters {list(dropped)} are not in the export, so they cannot be trained: the "
        "exporter's optimizer removes a zero-valued bias (an addition of zeros) and merges equal tensors, or the "
        "forward does not use them. Export with torch.onnx.export(..., optimize=False) to keep every parameter.",
        stacklevel=3,
    )


def _signature(
    forward: _ForwardAndLoss,
    params: Sequence[str],
    update: _Update,
    batch_inputs: Sequence[onnx.ValueInfoProto],
    candidates: Sequence[str],
) -> TrainStepSignature:
    """Names every input and output of the training models (``candidates``: what is trained by default)."""
    return TrainStepSignature(
        batch_inputs=tuple(value.name for value in batch_inputs),
        target=forward.target,
        loss=forward.loss_value,
        extra_outputs=tuple(forward.extra_outputs),
        params=tuple(params),
        new_params=tuple(update.new_param_outputs[name] for name in params),
        frozen=tuple(name for name in candidates if name not in params),
        state=update.state,
        new_state=update.new_state_outputs,
        grads=update.grad_inputs,
        lr=update.lr,
        step=update.step,
        grad_norm=update.grad_norm,
        all_finite=update.finite.name if update.finite else None,
        extra_targets=forward.extra_targets,
    )


@dataclasses.dataclass
class _ForwardAndLoss:
    """The prepared forward with the loss appended: what every training model starts from.

    Attributes:
        model: The prepared model.
        graph: Its graph with the loss nodes and constants.
        emitter: The emitter of the loss, which the backward and the optimizer continue.
        prediction: The output the loss reads.
        types: Static types of the prepared model's values.
        loss_value: The loss output.
        seed: Where the backward starts (``losses.gradient_seed``).
        target: The target input, None for a loss without one.
        target_infos: The target inputs' declarations (the target, then the extra targets).
        extra_targets: Torch's name of each extra target -> its input's name.
        extra_outputs: Model outputs the train step returns too.
        loss_elem: The loss's element type (the prediction's).
        loss_scalar: Whether the loss is a scalar (a reduction other than ``"none"``).
    """

    model: onnx.ModelProto
    graph: onnx.GraphProto
    emitter: GraphEmitter
    prediction: str
    types: dict[str, ValueType]
    loss_value: str
    seed: str | Mapping[str, str | None]
    target: str | None
    target_infos: list[onnx.ValueInfoProto]
    extra_targets: dict[str, str]
    extra_outputs: list[str]
    loss_elem: int
    loss_scalar: bool


def _add_loss(
    forward: onnx.ModelProto, loss: losses_module.Loss, output: str | None, target: str, extra_outputs: Sequence[str]
) -> _ForwardAndLoss:
    """Appends the loss (and its target inputs) to the prepared forward."""
    prediction = _select_prediction(forward, output)
    for name in extra_outputs:
        _select_prediction(forward, name)
    types = infer_value_types(forward)
    graph = forward.graph
    emitter = GraphEmitter(onnx_opset(forward), used_names(graph), types)
    emitter.record_constants(graph.initializer)
    losses_module.check_target(loss, types.get(prediction), None, prediction_name=prediction)
    extra_names: dict[str, str] = {}
    target_infos: list[onnx.ValueInfoProto] = []
    target_name = None
    if not loss.needs_target:
        loss_value = losses_module.add_loss(emitter, loss, prediction)
    else:
        if target in used_names(graph):
            raise ValueError(f"target {target!r}: the model already has a value of that name; choose another")
        target_name = target
        emitter.reserve([target_name])
        target_elem = _target_elem_type(loss, types.get(prediction))
        # Only the rank is declared, from the prediction's inferred one: an exporter's declared
        # output shape is never trusted for it; the loss's ops and the trainer check the feed.
        target_shape = _target_shape(loss, types.get(prediction), target_name)
        target_infos.append(_value_info_of(target_name, target_elem, target_shape))
        emitter.set_type(target_name, target_elem, target_shape)
        for extra in loss.extra_targets:
            # A model value of torch's name keeps it; the target input gets a fresh one.
            name = extra.name if extra.name not in used_names(graph) else emitter.fresh(extra.name)
            emitter.reserve([name])
            extra_names[extra.name] = name
            extra_shape = [f"{name}_dim0"]
            target_infos.append(_value_info_of(name, onnx.TensorProto.INT64, extra_shape))
            emitter.set_type(name, onnx.TensorProto.INT64, extra_shape)
        loss_value = losses_module.add_loss(emitter, loss, prediction, target_name, extra_names)
    # Where the backward starts: the loss value, or torch's gradient of the prediction for a loss
    # whose torch backward is not its forward's derivative (binary_cross_entropy).
    seed = losses_module.gradient_seed(emitter, loss, prediction, target_name, loss_value)
    loss_nodes = list(emitter.nodes)
    forward_and_loss = _graph_with(graph, loss_nodes, list(emitter.initializers))
    # The loss nodes' static types, so that their gradients' broadcasting resolves when the graph
    # is built (a scalar loss's chain rule took 14 run-time shape nodes per broadcast op without).
    _add_inferred_types(emitter, forward_and_loss, target_infos, _opsets_for(forward.opset_import, loss_nodes))
    return _ForwardAndLoss(
        forward,
        forward_and_loss,
        emitter,
        prediction,
        types,
        loss_value,
        seed,
        target_name,
        target_infos,
        extra_names,
        list(extra_outputs),
        loss_elem=types[prediction].elem_type if prediction in types else onnx.TensorProto.FLOAT,
        loss_scalar=getattr(loss, "reduction", "mean") != "none",
    )


@dataclasses.dataclass
class _Update:
    """The optimizer's part: its inputs, its nodes and the outputs it names.

    Attributes:
        lr: The learning-rate input.
        step: The step-count input.
        optimizers: Each parameter's optimizer (its group's).
        state: Per parameter, optimizer state slot -> input name.
        grad_inputs: Per parameter, the gradient input of the apply model.
        new_param_outputs: Per parameter, the output of its updated value.
        new_state_outputs: Per parameter, state slot -> output name.
        grad_norm: The total gradient norm output, when gradients are clipped.
        nodes: The optimizer's nodes.
        finite: The nodes of ``all_finite``, when asked for.
    """

    lr: str
    step: str
    optimizers: dict[str, optimizers_module.Optimizer]
    state: dict[str, dict[str, str]]
    grad_inputs: dict[str, str]
    new_param_outputs: dict[str, str]
    new_state_outputs: dict[str, dict[str, str]]
    grad_norm: str | None
    nodes: list[onnx.NodeProto]
    finite: FiniteCheck | None

    def initial_state(self, initial_params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each state input's starting value (zeros, as torch starts), from the parameters'."""
        return {
            self.state[name][slot]: value
            for name, optimizer in self.optimizers.items()
            for slot, value in optimizer.initial_state(initial_params[name]).items()
        }


def _add_update(
    forward: _ForwardAndLoss,
    params: Sequence[str],
    optimizer: optimizers_module.Optimizer,
    param_groups: Sequence[optimizers_module.ParamGroup],
    clip: optimizers_module.ClipGradNorm | optimizers_module.ClipGradValue | None,
    nonfinite_check: bool,
) -> _Update:
    """Emits the optimizer step (with clipping and the finite check) after the backward."""
    emitter = forward.emitter
    initializers = {init.name: init for init in forward.model.graph.initializer}
    first_opt_node = len(emitter.nodes)
    lr = emitter.fresh(LR_INPUT)
    step = emitter.fresh(STEP_INPUT)
    emitter.set_type(lr, onnx.TensorProto.DOUBLE, ())
    emitter.set_type(step, onnx.TensorProto.INT64, ())
    per_param = optimizers_module.resolve_groups(optimizer, params, param_groups)
    slots = {name: per_param[name][0].state_slots() for name in params}
    state = {name: {slot: emitter.fresh(f"{name}.{slot}") for slot in slots[name]} for name in params}
    # The apply model reads gradients as inputs; in the train step Identity nodes produce them.
    grad_inputs = {name: emitter.fresh(f"{name}.grad") for name in params}
    for name in params:
        for value in (name, grad_inputs[name], *state[name].values()):
            emitter.set_type(value, initializers[name].data_type, tuple(initializers[name].dims))
    update = optimizers_module.add_optimizer_step(
        emitter, optimizer, grad_inputs, state, lr, step, param_groups=param_groups, clip=clip
    )
    new_param_outputs = {name: emitter.fresh(f"{name}.new") for name in params}
    new_state_outputs = {name: {slot: emitter.fresh(f"{name}.{slot}.new") for slot in slots[name]} for name in params}
    outputs_of = {new_param_outputs[name]: update.params[name] for name in params}
    outputs_of.update(
        {new_state_outputs[name][slot]: update.state[name][slot] for name in params for slot in slots[name]}
    )
    _name_outputs(emitter, first_opt_node, outputs_of)
    nodes = emitter.nodes[first_opt_node:]
    loss = (forward.loss_value, forward.loss_elem, forward.loss_scalar)
    # The check reads the unclipped gradient inputs (or the norm before clipping): clamping hides no NaN.
    norm_clip = clip if isinstance(clip, optimizers_module.ClipGradNorm) else None
    finite = add_finite_check(emitter, loss, grad_inputs, update.total_norm, norm_clip) if nonfinite_check else None
    return _Update(
        lr,
        step,
        {name: per_param[name][0] for name in params},
        state,
        grad_inputs,
        new_param_outputs,
        new_state_outputs,
        update.total_norm,
        nodes,
        finite,
    )


class _Assembly:
    """Makes the four training models from the parts, each pruned to what its outputs need."""

    def __init__(
        self,
        forward: _ForwardAndLoss,
        params: Sequence[str],
        update: _Update,
        ir_version: int,
        backward: tuple[list[onnx.NodeProto], Mapping[str, str]],
    ) -> None:
        """The parts of the models.

        Args:
            forward: The forward and loss.
            params: The trained parameters.
            update: The optimizer's part.
            ir_version: The models' IR version.
            backward: The backward's nodes, and each parameter's gradient value.
        """
        graph = forward.model.graph
        grad_nodes, gradients = backward
        # train step: gradients feed the update through Identity nodes named as the apply model's inputs.
        links = [
            make_checked_node(
                onnx_opset(forward.model),
                "Identity",
                [gradients[name]],
                [update.grad_inputs[name]],
                name=f"{update.grad_inputs[name]}/link",
            )
            for name in params
        ]
        self._backward = [*grad_nodes, *links]
        self._forward = forward
        self._params = list(params)
        self._update = update
        self._ir_version = ir_version
        self.initializers = {init.name: init for init in graph.initializer}
        self.batch_inputs = [value for value in graph.input if value.name not in self.initializers]
        self._data_inputs = [*self.batch_inputs, *forward.target_infos]
        self._param_inputs = [self._param_info(name) for name in params]
        self._grad_inputs = [self._param_info(name, update.grad_inputs[name]) for name in params]
        self._loss_info = _value_info_of(forward.loss_value, forward.loss_elem, [] if forward.loss_scalar else None)
        self._lr_and_step = [
            _value_info_of(update.lr, onnx.TensorProto.DOUBLE, []),
            _value_info_of(update.step, onnx.TensorProto.INT64, []),
        ]
        slots = [(name, slot) for name in params for slot in update.state[name]]
        self._state_inputs = [self._param_info(name, update.state[name][slot]) for name, slot in slots]
        self._updated = [
            *(self._param_info(name, update.new_param_outputs[name]) for name in params),
            *(self._param_info(name, update.new_state_outputs[name][slot]) for name, slot in slots),
        ]
        if update.grad_norm:
            self._updated.append(_value_info_of(update.grad_norm, self.initializers[params[0]].data_type, []))
        if update.finite:
            self._updated.append(_value_info_of(update.finite.name, onnx.TensorProto.BOOL, []))

    def _param_info(self, name: str, renamed: str | None = None) -> onnx.ValueInfoProto:
        init = self.initializers[name]
        return _value_info_of(renamed or name, init.data_type, list(init.dims))

    def train_step(self) -> onnx.ModelProto:
        """Forward, loss, backward and update in one model."""
        update = self._update
        extra_infos = [_inferred_info(name, self._forward.types) for name in self._forward.extra_outputs]
        return self._model(
            "train_step",
            [*self._backward, *update.nodes, *(update.finite.train_step_nodes if update.finite else [])],
            [*self._data_inputs, *self._param_inputs, *self._state_inputs, *self._lr_and_step],
            [self._loss_info, *extra_infos, *self._updated],
        )

    def gradients(self) -> onnx.ModelProto:
        """Forward, loss and the parameters' gradients."""
        extra_infos = [_inferred_info(name, self._forward.types) for name in self._forward.extra_outputs]
        return self._model(
            "gradients",
            self._backward,
            [*self._data_inputs, *self._param_inputs],
            [self._loss_info, *extra_infos, *self._grad_inputs],
        )

    def apply(self) -> onnx.ModelProto:
        """Clipping and the update, from gradients as inputs."""
        update = self._update
        return self._model(
            "apply",
            [*update.nodes, *(update.finite.apply_nodes if update.finite else [])],
            [*self._param_inputs, *self._grad_inputs, *self._state_inputs, *self._lr_and_step],
            self._updated,
            with_forward=False,
        )

    def eval(self) -> onnx.ModelProto:
        """Forward and loss, Dropout off."""
        forward = self._forward
        outputs = [_inferred_info(out.name, forward.types) for out in forward.model.graph.output]
        result = self._model(
            "eval",
            [],
            [*self._data_inputs, *self._param_inputs],
            [self._loss_info, *(info for info in outputs if info.name != forward.loss_value)],
        )
        _set_dropout_training(result.graph, False, forward.emitter)
        return result

    def _model(
        self,
        name: str,
        nodes: Sequence[onnx.NodeProto],
        inputs: Sequence[onnx.ValueInfoProto],
        outputs: Sequence[onnx.ValueInfoProto],
        with_forward: bool = True,
    ) -> onnx.ModelProto:
        forward, emitter = self._forward, self._forward.emitter
        all_nodes = [*forward.graph.node, *nodes] if with_forward else list(nodes)
        # Equal constants are shared by the emitter across the forward, gradient and optimizer
        # parts, so every model gets all of them; _without_unused drops those it does not read.
        kept = [init for init in forward.model.graph.initializer if init.name not in self._params]
        base = [*kept, *emitter.initializers] if with_forward else list(emitter.initializers)
        graph = onnx.helper.make_graph(all_nodes, name, list(inputs), list(outputs), base)
        result = onnx.helper.make_model(graph, opset_imports=_opsets_for(forward.model.opset_import, all_nodes))
        result.ir_version = self._ir_version
        result.functions.extend(forward.model.functions)
        return _without_unused(result)


def _name_outputs(emitter: GraphEmitter, first: int, outputs_of: Mapping[str, str]) -> None:
    """Gives each update's value its output name: the node that computes it writes the output.

    An Identity to a graph output is a copy in onnxruntime (it cannot alias a bound output): one
    pass over every parameter and moment per step (1.5 M values at (64, 32, 256, 256)). So the
    producing node among ``emitter.nodes[first:]`` (the optimizer's) is renamed, and its readers
    there; an Identity is left only for a value the optimizer did not compute or that feeds two
    outputs.
    """
    nodes = emitter.nodes[first:]
    producers = {name: node for node in nodes for name in node.output if name}
    renamed: dict[str, str] = {}
    for output, value in outputs_of.items():
        node = producers.get(value)
        if node is None or value in renamed:
            emitter.op("Identity", [renamed.get(value, value)], outputs=[output])
            continue
        renamed[value] = output
        node.output[list(node.output).index(value)] = output
        for reader in nodes:
            for index, name in enumerate(reader.input):
                if name == value:
                    reader.input[index] = output


def _add_inferred_types(
    emitter: GraphEmitter,
    graph: onnx.GraphProto,
    extra_inputs: Sequence[onnx.ValueInfoProto],
    opsets: Sequence[onnx.OperatorSetIdProto],
) -> None:
    """Records onnx's inferred types of ``graph``'s values that ``emitter`` does not know yet."""
    probe = _graph_with(graph, [], [])
    probe.input.extend(extra_inputs)
    model = onnx.helper.make_model(probe, opset_imports=list(opsets))
    for name, value_type in infer_value_types(model).items():
        if emitter.value_type(name) is None:
            emitter.set_type(name, value_type.elem_type, value_type.shape)


def _graph_with(
    graph: onnx.GraphProto, nodes: Sequence[onnx.NodeProto], initializers: Sequence[onnx.TensorProto]
) -> onnx.GraphProto:
    result = onnx.GraphProto()
    result.CopyFrom(graph)
    result.node.extend(nodes)
    result.initializer.extend(initializers)
    return result


def _without_unused(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drops nodes and initializers that no output needs (e.g. forward work an apply model lacks)."""
    prune_to_outputs(model.graph)
    return model
