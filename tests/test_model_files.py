"""``load_model_file``, ortlstm's one model loader: what is wrong with a model file, in one line naming it.

Oracles: files made wrong on purpose (not protobuf, empty, a directory, external data deleted or
cut short) and, for the good cases, ``onnx.load`` of the same file (the tensors it reads).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from ortlstm.demo import build_classifier
from ortlstm.fit import build_trainer
from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.model_files import load_model_file
from ortlstm.training import Trainer, export_directory


def external_model(directory: Path) -> tuple[Path, Path]:
    """The classifier saved with every initializer in ``model.onnx.data`` beside it, as a dynamo export is."""
    path = directory / "model.onnx"
    onnx.save(
        build_classifier(8, seed=0),
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    return path, directory / "model.onnx.data"


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


def test_a_model_with_external_data_beside_it_loads_as_onnx_loads_it(tmp_path: Path) -> None:
    path, _ = external_model(tmp_path)
    loaded, expected = initializers(load_model_file(path)), initializers(onnx.load(str(path)))
    assert sorted(loaded) == sorted(expected) and len(loaded) > 2
    for name, value in expected.items():
        assert np.array_equal(loaded[name], value), name


def test_missing_external_data_names_the_file_where_it_was_expected_and_what_to_copy(tmp_path: Path) -> None:
    path, data = external_model(tmp_path)
    data.unlink()
    with pytest.raises(ValueError) as raised:
        load_model_file(path)
    assert str(raised.value) == (
        f"{path}: its external data 'model.onnx.data' is missing: expected at {data.resolve()} (a torch.onnx.export "
        "with dynamo writes the weights beside the .onnx file: copy both)"
    )


def test_external_data_cut_short_is_refused_naming_its_size(tmp_path: Path) -> None:
    path, data = external_model(tmp_path)
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"external data 'model.onnx.data' .* holds 100 bytes, but tensor '.*' ends"):
        load_model_file(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"hello, this is not a model\n", r"not an ONNX model \(protobuf parse failed\)"),
        (b"", r"not an ONNX model \(it parses as protobuf but holds no graph or no opset_import\)"),
    ],
    ids=["text", "empty"],
)
def test_a_file_that_is_not_a_model_is_refused_naming_it(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"^{path}: {message}"):
        load_model_file(path)


def test_a_directory_or_no_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match=rf"^{tmp_path}: a directory, not a model file \(pass the .onnx file\)"):
        load_model_file(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^no model file 'missing.onnx'$"):
        load_model_file("missing.onnx")


def test_every_loader_of_ortlstm_reads_through_it(tmp_path: Path) -> None:
    """The Trainer given a path, fit's build_trainer and export of a training directory give the same line."""
    path, data = external_model(tmp_path)
    options = {"loss": losses.Loss.cross_entropy(), "optimizer": optimizers.SGD(lr=0.1)}
    Trainer(path, **options).write(tmp_path / "run")  # type: ignore[arg-type]
    data.unlink()
    (tmp_path / "run" / "model.onnx").write_bytes(b"not a model")
    with pytest.raises(ValueError, match=r"its external data 'model\.onnx\.data' is missing"):
        Trainer(path, **options)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"its external data 'model\.onnx\.data' is missing"):
        build_trainer(path, **options)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"run/model.onnx: not an ONNX model \(protobuf parse failed\)"):
        export_directory(tmp_path / "run", tmp_path / "out.onnx")
