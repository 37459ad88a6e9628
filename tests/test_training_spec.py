"""``TrainingSpec``: the one list of a Trainer's options, and what derives from it.

The list must stay the Trainer's: every keyword of ``Trainer`` is a field, every argument the spec
passes is one ``build_training_models`` takes, what is saved reads back, and what a loaded
checkpoint is compared on leaves out exactly the run-time values (the optimizer's lr). Nothing
here imports torch.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_trainer import batches, classifier, trainer

from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.train_step import build_training_models
from ortlstm.training import Trainer, TrainingSpec


def rich_spec() -> TrainingSpec:
    """A spec whose every saved field differs from its default."""
    return TrainingSpec(
        loss=losses.Loss.cross_entropy(weight=[0.5, 2.0, 1.0], label_smoothing=0.1),
        optimizer=optimizers.AdamW(lr=0.05, betas=(0.8, 0.9)),
        requires_grad=("lstm.W", "head.bias"),
        prediction="logits",
        target="labels",
        extra_outputs=("logits",),
        param_groups=(optimizers.ParamGroup(params=("head.bias",), weight_decay=0.0),),
        clip_grad_norm=1.0,
        clip_norm_type=float("inf"),
        clip_grad_value=0.25,  # a spec holds it; building refuses it together with clip_grad_norm
        stateful=True,
        frozen=("head.weight",),
        fixed_shapes={"pixels": (None, 3, None)},
        ir_version=9,
        lr=lambda n: 0.1,
        threads=1,
        nonfinite="skip",
    )


def test_every_trainer_keyword_is_a_spec_field_and_back() -> None:
    keywords = [name for name in inspect.signature(Trainer.__init__).parameters if name not in ("self", "model")]
    spec = TrainingSpec(loss=losses.Loss.mse_loss(), optimizer=optimizers.SGD())
    assert sorted(keywords) == sorted(spec.trainer_options())
    # The run-time keywords of the file constructors are spec fields that are neither saved nor built.
    runtime = {
        field.name
        for field in dataclasses.fields(TrainingSpec)
        if field.metadata["role"].saved is None and field.metadata["role"].build is None
    }
    for constructor in (Trainer.open, Trainer.from_checkpoint):
        named = set(inspect.signature(constructor).parameters) - {"cls", "directory", "model", "checkpoint"}
        assert named == runtime == {"lr", "threads", "nonfinite"}


def test_the_build_arguments_are_the_builders_keywords() -> None:
    arguments = rich_spec().build_arguments()
    builder = inspect.signature(build_training_models).parameters
    assert set(arguments) <= set(builder)
    assert arguments["output"] == "logits"
    assert arguments["fixed_shapes"] == {"pixels": [None, 3, None]}
    assert arguments["fixed_inputs"] is None
    assert arguments["target"] == "labels"
    assert dataclasses.replace(rich_spec(), target=None).build_arguments()["target"] == "target"
    assert not {"lr", "threads", "nonfinite", "stateful"} & set(arguments)


def test_json_reads_back_without_the_runtime_options() -> None:
    spec = rich_spec()
    data = json.loads(json.dumps(spec.to_json()))
    assert list(data) == [
        "loss",
        "optimizer",
        "requires_grad",
        "prediction",
        "target",
        "extra_outputs",
        "param_groups",
        "clip_grad_norm",
        "clip_norm_type",
        "clip_grad_value",
        "stateful",
        "frozen",
        "fixed_shapes",
        "ir_version",
        "precision",
    ]
    restored = TrainingSpec.from_json(data)
    assert restored.to_json() == spec.to_json()
    assert (restored.lr, restored.threads, restored.nonfinite, restored.fixed_inputs) == (None, None, "raise", {})
    for added_later in ("clip_grad_value", "stateful", "frozen", "fixed_shapes", "ir_version"):
        default = next(field.default for field in dataclasses.fields(TrainingSpec) if field.name == added_later)
        without = {key: value for key, value in data.items() if key != added_later}
        assert getattr(TrainingSpec.from_json(without), added_later) == default
    with pytest.raises(KeyError, match="clip_grad_norm"):
        TrainingSpec.from_json({k: v for k, v in data.items() if k != "clip_grad_norm"})


def test_a_loaded_spec_is_compared_on_all_but_the_runtime_values() -> None:
    spec = rich_spec()
    other_lr = dataclasses.replace(spec, optimizer=optimizers.AdamW(lr=0.5, betas=(0.8, 0.9)), lr=None, threads=2)
    assert spec.differences(other_lr) == []
    assert "lr" in spec.to_json()["optimizer"]
    assert "lr" not in spec.graph_json()["optimizer"]
    other_betas = dataclasses.replace(spec, optimizer=optimizers.AdamW(lr=0.05, betas=(0.9, 0.9)))
    (difference,) = spec.differences(other_betas)
    assert difference.startswith("optimizer: saved {'name': 'AdamW', 'betas': [0.9, 0.9]")
    assert [line.split(":")[0] for line in spec.differences(dataclasses.replace(spec, stateful=False, frozen=()))] == [
        "frozen",
        "stateful",
    ]


def test_from_checkpoint_rebuilds_the_spec_with_the_runtime_options_given(tmp_path: Path) -> None:
    subject = trainer(clip_grad_norm=1.0, extra_outputs=["logits"], frozen=["head.weight"], nonfinite="skip")
    ((x, y),) = batches(1)
    subject.step(x, target=y)
    path = subject.save(tmp_path / "run.safetensors")

    def schedule(n: int) -> float:
        return 0.01 / (n + 1)

    resumed = Trainer.from_checkpoint(classifier(), path, lr=schedule, threads=1)
    assert resumed.spec.to_json() == subject.spec.to_json()
    assert resumed.spec.requires_grad == subject.spec.requires_grad == ("lstm.W", "lstm.R", "lstm.B", "head.bias")
    assert (resumed.spec.lr, resumed.spec.threads, resumed.nonfinite) == (schedule, 1, "raise")
    assert resumed.learning_rate() == schedule(1)
    for name, value in subject.parameters.items():
        np.testing.assert_array_equal(resumed.parameters[name], value, err_msg=name)


def test_a_checkpoint_whose_spec_cannot_be_read_is_refused(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.numpy import save_file

    path = trainer().save(tmp_path / "run.safetensors")
    with safe_open(str(path), framework="numpy") as handle:
        metadata = dict(handle.metadata())
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a dict
    spec = json.loads(metadata["spec"])
    del spec["prediction"]
    save_file(tensors, str(path), metadata={**metadata, "spec": json.dumps(spec)})
    with pytest.raises(ValueError, match=r"the checkpoint's training spec cannot be read \('prediction'\)"):
        trainer().load(path)


def imported_modules(path: Path) -> set[str]:
    """The modules a source file imports, at any depth (lazy imports inside functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_ort_training_imports_onnxruntime_training_and_graphs_no_onnxruntime() -> None:
    """The layering the packages stand for: the Trainer runs in plain onnxruntime, graphs/ in none."""
    root = Path(__file__).resolve().parent.parent
    for path in sorted((root / "src" / "ortlstm" / "training").glob("*.py")):
        modules = imported_modules(path)
        assert not {name for name in modules if name.startswith(("onnxruntime.training", "torch"))}, path.name
    assert "onnxruntime.training.api" in imported_modules(root / "src" / "ortlstm" / "ort_training" / "checkpoint.py")
    for name in ("carried_state.py", "structure.py"):
        assert not {module for module in imported_modules(root / "graphs" / name) if module.startswith("onnxruntime")}


def test_importing_the_trainer_leaves_the_onnxruntime_training_path_unimported() -> None:
    """``import ortlstm.training`` imports no ``ortlstm.ort_training`` (which imports it back); its names still work.

    A fresh interpreter, since this one's tests have imported everything.
    """
    code = (
        "import sys\n"
        "import ortlstm.training as training\n"
        "loaded = sorted(name for name in sys.modules if name.startswith('ortlstm.ort_training'))\n"
        "assert not loaded, loaded\n"
        "import ortlstm.ort_training as ort_training\n"
        "assert training.OrtTrainingImport is ort_training.OrtTrainingImport\n"
        "assert training.ORT_TRAINING_ADAMW_EPS == ort_training.ORT_TRAINING_ADAMW_EPS\n"
        "from ortlstm.training import OrtTrainingCheckpoint, read_onnxruntime_training_checkpoint\n"
        "assert read_onnxruntime_training_checkpoint is ort_training.read_onnxruntime_training_checkpoint\n"
        "try:\n"
        "    training.NotAName\n"
        "except AttributeError as error:\n"
        "    assert str(error) == \"module 'ortlstm.training' has no attribute 'NotAName'\", error\n"
        "else:\n"
        "    raise AssertionError('training.NotAName did not raise')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
