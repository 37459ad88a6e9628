"""Commands on model files: ``convert``, ``train-step``, ``export``, and ``artifacts`` (onnxruntime-training)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ortlstm.cli.common import add_trainer_extras, add_training_options, renamed_values, trainer_arguments

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
    convert = commands.add_parser("convert", help="rewrite a model's ONNX LSTM nodes into ortlstm LSTMTraining")
    convert.add_argument("input", type=Path)
    convert.add_argument("output", type=Path)


def add_train_step(commands: Any) -> None:
    """The parser of ``train-step``."""
    train_step = commands.add_parser(
        "train-step",
        help="write the training models of a model (plain onnxruntime, no training build) and its initial state",
        description="Builds the train-step, eval, gradients and apply models of MODEL (any onnxruntime runs them "
        "with the ortlstm library) and writes them to DIR with the original model, training.json and the "
        "initial state (state.safetensors). Train with ortlstm.training.Trainer.open(DIR); export the result "
        "with `ortlstm export DIR OUT.onnx`.",
    )
    train_step.add_argument("model", type=Path)
    train_step.add_argument("directory", type=Path)
    add_training_options(train_step)
    # Every Trainer option the directory records (training.json); not the run-time ones (lr, threads, nonfinite).
    add_trainer_extras(train_step, run_time=False)


def add_export(commands: Any) -> None:
    """The parser of ``export``."""
    export = commands.add_parser(
        "export",
        help="write the trained model of a train-step directory (standard ONNX ops, runs without ortlstm)",
    )
    export.add_argument("directory", type=Path)
    export.add_argument("output", type=Path)
    export.add_argument("--checkpoint", type=Path, default=None, help="default: DIR/state.safetensors")


def add_artifacts(commands: Any) -> None:
    """The parser of ``artifacts``."""
    artifacts = commands.add_parser("artifacts", help="generate onnxruntime-training artifacts for a model")
    artifacts.add_argument("model", type=Path)
    artifacts.add_argument("directory", type=Path)
    artifacts.add_argument("--requires-grad", nargs="+", default=None, metavar="NAME", help="default: all floats")
    artifacts.add_argument("--frozen", nargs="+", default=[], metavar="NAME")
    artifacts.add_argument(
        "--loss",
        choices=tuple(_ARTIFACT_LOSSES),
        type=renamed_values(artifacts.prog, "--loss", _OLD_ARTIFACT_LOSSES),
        default="cross_entropy",
        help="onnxruntime-training's loss of that torch name (default cross_entropy)",
    )
    artifacts.add_argument(
        "--optimizer",
        choices=tuple(_ARTIFACT_OPTIMIZERS),
        type=renamed_values(artifacts.prog, "--optimizer", _OLD_ARTIFACT_OPTIMIZERS),
        default="adamw",
        help="onnxruntime-training's optimizer (its adamw is not torch's: see docs/training.md; default adamw)",
    )
    artifacts.add_argument(
        "--loss-input", nargs="+", default=None, metavar="NAME", help="the output(s) the loss reads (several outputs)"
    )


def convert_command(args: argparse.Namespace) -> int:
    """``ortlstm convert``: writes the converted model and lists the LSTM nodes converted."""
    import onnx

    from ortlstm.graphs.convert import convert_with_report, quantized_lstms
    from ortlstm.graphs.model_files import load_model_file

    converted, nodes = convert_with_report(load_model_file(args.input))
    onnx.save(converted, str(args.output))
    print(f"{args.output}: {len(nodes)} LSTM node(s) now run as ortlstm.LSTMTraining:")
    for node in nodes:
        print(f"  {node.name!r} in {node.where}")
    for node in quantized_lstms(converted):
        print(f"  not converted: DynamicQuantizeLSTM {node.name!r} in {node.where} (quantized LSTMs are not trainable)")
    return 0


def train_step_command(args: argparse.Namespace) -> int:
    """``ortlstm train-step``: writes the training models and the initial state to a new directory."""
    from ortlstm.training import MANIFEST_FILE, Trainer

    if (args.directory / MANIFEST_FILE).exists():
        raise ValueError(
            f"{args.directory} already holds training models ({MANIFEST_FILE}); choose another directory "
            "or delete that one"
        )
    options = trainer_arguments(args)
    optimizer = options["optimizer"]
    trainer = Trainer(args.model, **options)
    trainer.write(args.directory)
    signature = trainer.signature
    optional = {extra.name for extra in trainer.spec.loss.extra_targets if not extra.required}
    feeds = [
        *signature.batch_inputs,
        *([signature.target] if signature.target else []),
        *(f"{name} (optional)" if port in optional else name for port, name in signature.extra_targets.items()),
    ]
    print(f"{args.directory}: train_step.onnx, eval.onnx, gradients.onnx, apply.onnx, model.onnx, training.json, ")
    print(
        f"  state.safetensors (step 0); batch feeds: {', '.join(feeds)}; {type(optimizer).__name__} lr {optimizer.lr:g}"
    )
    print(trainer.summary())
    print(f"train: ortlstm.training.Trainer.open({str(args.directory)!r})")
    print(f"export: ortlstm export {args.directory} OUT.onnx")
    return 0


def export_command(args: argparse.Namespace) -> int:
    """``ortlstm export``: writes the trained model of a train-step directory."""
    from ortlstm.training import export_directory

    export_directory(args.directory, args.output, args.checkpoint)
    print(f"{args.output}: the original model with the trained parameters (standard ONNX ops)")
    return 0


def artifacts_command(args: argparse.Namespace) -> int:
    """``ortlstm artifacts``: writes onnxruntime-training's artifacts and prints their paths."""
    from ortlstm.graphs import generate_artifacts
    from ortlstm.graphs.model_files import load_model_file
    from ortlstm.graphs.ort_training.gradient import import_training_runtime

    ort_artifacts = import_training_runtime().artifacts  # onnxruntime.training imports its artifacts module

    result = generate_artifacts(
        load_model_file(args.model),
        requires_grad=args.requires_grad,
        frozen_params=args.frozen,
        loss=getattr(ort_artifacts.LossType, _ARTIFACT_LOSSES[args.loss]),
        optimizer=getattr(ort_artifacts.OptimType, _ARTIFACT_OPTIMIZERS[args.optimizer]),
        artifact_directory=args.directory,
        **({"loss_input_names": args.loss_input} if args.loss_input else {}),
    )
    for path in (result.training_model, result.eval_model, result.optimizer_model, result.checkpoint):
        print(path)
    return 0
