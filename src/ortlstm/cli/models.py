"""Commands on model files: ``convert``, ``train-step``, ``export``, and ``artifacts`` (onnxruntime-training)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortlstm.cli.common import (
    add_out,
    add_quantize,
    add_trainer_extras,
    add_training_options,
    output_path,
    renamed_values,
    show_defaults,
    trainer_arguments,
)

if TYPE_CHECKING:
    import onnx

# artifacts: the losses and optimizers onnxruntime-training builds -> its LossType / OptimType names
_ARTIFACT_LOSSES = {
    "cross_entropy": "CrossEntropyLoss",
    "mse_loss": "MSELoss",
    "binary_cross_entropy_with_logits": "BCEWithLogitsLoss",
    "l1_loss": "L1Loss",
}
_ARTIFACT_OPTIMIZERS = {"adamw": "AdamW", "sgd": "SGD"}
# Old spellings, still accepted with a deprecation message on stderr: old -> new.
_OLD_ARTIFACT_LOSSES = {old: new for new, old in _ARTIFACT_LOSSES.items()}
_OLD_ARTIFACT_OPTIMIZERS = {old: new for new, old in _ARTIFACT_OPTIMIZERS.items()}


def add_convert(commands: Any) -> None:
    """The parser of ``convert``."""
    convert = commands.add_parser(
        "convert",
        help="rewrite a model's ONNX LSTM nodes into ortlstm LSTMTraining",
        description="Rewrites every standard ONNX LSTM node of INPUT into the ortlstm LSTMTraining op (the same "
        "outputs, plus every hidden state, cell state and gate, which LSTMGrad reads) and writes the model to "
        "--out; lists each node converted, and the quantized LSTMs it cannot train. Running the converted model "
        "needs the ortlstm library (ortlstm.ops.session_options()); `ortlstm export` and the Trainer write "
        "models with standard ops only.",
    )
    convert.add_argument("input", type=Path, help="the model (.onnx)")
    add_out(convert, "the converted model", positional=True)
    show_defaults(convert)


def add_train_step(commands: Any) -> None:
    """The parser of ``train-step``."""
    train_step = commands.add_parser(
        "train-step",
        help="write the training models of a model (plain onnxruntime, no training build) and its initial state",
        description="Builds the train-step, eval, gradients and apply models of MODEL (any onnxruntime runs them "
        "with the ortlstm library) and writes them to the directory --out with the original model, "
        "training.json and the initial state (state.safetensors). Train with "
        "ortlstm.training.Trainer.open(DIR); export the result with `ortlstm export DIR --out OUT.onnx`.",
    )
    train_step.add_argument("model", type=Path, help="the model (.onnx)")
    add_out(train_step, "the directory to write (new, or without training.json)", positional=True)
    add_training_options(train_step)
    # Every Trainer option the directory records (training.json); not the run-time ones (lr, threads, nonfinite).
    add_trainer_extras(train_step, run_time=False)
    show_defaults(train_step)


def add_export(commands: Any) -> None:
    """The parser of ``export``."""
    export = commands.add_parser(
        "export",
        help="write the trained model of a train-step directory (standard ONNX ops, runs without ortlstm)",
        description="Writes the original model of DIRECTORY (written by `ortlstm train-step` or Trainer.write) "
        "with the trained parameters of its checkpoint to --out: the model as shipped, standard ONNX ops only, "
        "which any onnxruntime runs without the ortlstm library.",
    )
    export.add_argument("directory", type=Path, help="a train-step directory")
    add_out(export, "the trained model (.onnx)", positional=True)
    export.add_argument("--checkpoint", type=Path, default=None, help="default: DIR/state.safetensors")
    add_quantize(export)
    show_defaults(export)


def add_artifacts(commands: Any) -> None:
    """The parser of ``artifacts``: fit's vocabulary and defaults (--loss, --optimizer required; torch's parameters)."""
    artifacts = commands.add_parser(
        "artifacts",
        help="generate onnxruntime-training artifacts for a model",
        description="Writes onnxruntime-training 1.19.2's training, eval and optimizer models and checkpoint for "
        "MODEL to the directory --out, its ONNX LSTMs converted to the ortlstm ops (pip install "
        "'ortlstm[train]'). Like fit, it needs --loss and --optimizer and trains what torch trains: a torch "
        "export's parameters, read from its metadata (never its buffers); without metadata, float "
        "initializers of rank >= 1 but the LSTMs' initial states. Prefer `ortlstm train-step` or `ortlstm fit`: "
        "their losses and optimizers follow torch exactly and they need only plain onnxruntime.",
    )
    artifacts.add_argument("model", type=Path, help="the model (.onnx)")
    add_out(artifacts, "the directory to write", positional=True)
    artifacts.add_argument(
        "--requires-grad",
        nargs="+",
        default=None,
        metavar="NAME",
        help="initializers to train (default: what torch trains, as fit and train-step choose)",
    )
    artifacts.add_argument(
        "--frozen",
        nargs="+",
        default=[],
        metavar="PATTERN",
        help="parameters not to train: names, globs or module prefixes (torch names too, with an export's metadata)",
    )
    artifacts.add_argument(
        "--loss",
        choices=tuple(_ARTIFACT_LOSSES),
        type=renamed_values(artifacts.prog, "--loss", _OLD_ARTIFACT_LOSSES),
        required=True,
        help="onnxruntime-training's loss of that torch name",
    )
    artifacts.add_argument(
        "--optimizer",
        choices=tuple(_ARTIFACT_OPTIMIZERS),
        type=renamed_values(artifacts.prog, "--optimizer", _OLD_ARTIFACT_OPTIMIZERS),
        required=True,
        help="onnxruntime-training's optimizer (its adamw is not torch's: see docs/training.md)",
    )
    artifacts.add_argument(
        "--loss-input", nargs="+", default=None, metavar="NAME", help="the output(s) the loss reads (several outputs)"
    )
    show_defaults(artifacts)


def artifact_parameters(
    model: onnx.ModelProto, requires_grad: list[str] | None, frozen: list[str]
) -> tuple[list[str] | None, list[str]]:
    """``requires_grad`` and ``frozen_params`` for ``generate_artifacts``: what the Trainer would train.

    With a torch export's metadata, the Trainer's default (torch's parameters, never buffers:
    ``prepare_model``'s candidates) and ``frozen`` read as the Trainer reads it (names, globs,
    module prefixes, torch names of folded initializers). Without it, ``generate_artifacts``'
    own default (float initializers of rank >= 1 but the LSTMs' initial states, which it cannot
    train) and ``frozen`` as initializer names.

    Raises:
        ValueError: A frozen pattern matches nothing, or half of a folded initializer.
    """
    from ortlstm.graphs.export_metadata import read_torch_origins
    from ortlstm.graphs.param_selection import default_requires_grad
    from ortlstm.graphs.parameters import resolve_frozen
    from ortlstm.graphs.prepare import prepare_model

    if read_torch_origins(model) is None:
        return requires_grad, frozen
    prepared = prepare_model(model, keep=requires_grad or ())
    initializers = [init.name for init in model.graph.initializer]
    candidates = [name for name in default_requires_grad(prepared) if name in initializers]
    frozen_names = resolve_frozen(
        frozen,
        [*dict.fromkeys([*candidates, *(requires_grad or ())])],
        prepared.sources,
        known=[*initializers, *prepared.dropped],
    )
    if requires_grad is None:
        requires_grad = [name for name in candidates if name not in frozen_names]
    return requires_grad, [name for name in initializers if name in frozen_names]


def convert_command(args: argparse.Namespace) -> int:
    """``ortlstm convert``: writes the converted model and lists the LSTM nodes converted."""
    import onnx

    from ortlstm.graphs.convert import INT8_ADVICE, convert_with_report, quantized_lstms
    from ortlstm.graphs.model_files import load_model_file

    out = output_path(args)
    converted, nodes = convert_with_report(load_model_file(args.input))
    onnx.save(converted, str(out))
    print(f"{out}: {len(nodes)} LSTM node(s) now run as ortlstm.LSTMTraining:")
    for node in nodes:
        print(f"  {node.name!r} in {node.where}")
    for node in quantized_lstms(converted):
        print(f"  not converted: DynamicQuantizeLSTM {node.name!r} in {node.where} (int8: {INT8_ADVICE})")
    return 0


def train_step_command(args: argparse.Namespace) -> int:
    """``ortlstm train-step``: writes the training models and the initial state to a new directory."""
    from ortlstm.training import MANIFEST_FILE, Trainer

    directory = output_path(args)
    if (directory / MANIFEST_FILE).exists():
        raise ValueError(
            f"{directory} already holds training models ({MANIFEST_FILE}); choose another directory "
            "or delete that one"
        )
    options = trainer_arguments(args)
    optimizer = options["optimizer"]
    trainer = Trainer(args.model, **options)
    trainer.write(directory)
    signature = trainer.signature
    optional = {extra.name for extra in trainer.spec.loss.extra_targets if not extra.required}
    feeds = [
        *signature.batch_inputs,
        *([signature.target] if signature.target else []),
        *(f"{name} (optional)" if port in optional else name for port, name in signature.extra_targets.items()),
    ]
    print(f"{directory}: train_step.onnx, eval.onnx, gradients.onnx, apply.onnx, model.onnx, training.json, ")
    print(
        f"  state.safetensors (step 0); batch feeds: {', '.join(feeds)}; {type(optimizer).__name__} lr {optimizer.lr:g}"
    )
    print(trainer.summary())
    print(f"train: ortlstm.training.Trainer.open({str(directory)!r})")
    print(f"export: ortlstm export {directory} --out OUT.onnx")
    return 0


def export_command(args: argparse.Namespace) -> int:
    """``ortlstm export``: writes the trained model of a train-step directory."""
    from ortlstm.training import export_directory

    out = output_path(args)
    export_directory(args.directory, out, args.checkpoint, args.quantize)
    kind = "int8, onnxruntime.quantization.quantize_dynamic" if args.quantize else "standard ONNX ops"
    print(f"{out}: the original model with the trained parameters ({kind})")
    return 0


def artifacts_command(args: argparse.Namespace) -> int:
    """``ortlstm artifacts``: writes onnxruntime-training's artifacts and prints their paths."""
    from ortlstm.graphs import generate_artifacts
    from ortlstm.graphs.model_files import load_model_file
    from ortlstm.graphs.ort_training.gradient import import_training_runtime

    ort_artifacts = import_training_runtime().artifacts  # onnxruntime.training imports its artifacts module

    model = load_model_file(args.model)
    requires_grad, frozen = artifact_parameters(model, args.requires_grad, args.frozen)
    result = generate_artifacts(
        model,
        requires_grad=requires_grad,
        frozen_params=frozen,
        loss=getattr(ort_artifacts.LossType, _ARTIFACT_LOSSES[args.loss]),
        optimizer=getattr(ort_artifacts.OptimType, _ARTIFACT_OPTIMIZERS[args.optimizer]),
        artifact_directory=output_path(args),
        **({"loss_input_names": args.loss_input} if args.loss_input else {}),
    )
    for path in (result.training_model, result.eval_model, result.optimizer_model, result.checkpoint):
        print(path)
    return 0
