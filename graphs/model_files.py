"""Reading a model file: ortlstm's one loader, whose errors name the file and say what is wrong.

``onnx.load`` answers a file that is not a model with a protobuf ``DecodeError`` (or, for an empty
or foreign file that happens to parse, an empty model that fails much later), and a model whose
external data was not copied beside it with a checker error about a ``TensorProto``. Every
loader of ortlstm (``ortlstm fit``, ``train-step``, ``convert``, ``artifacts``, ``export``, the
Trainer given a path, a training directory) reads through ``load_model_file`` instead, so that
each of these is one line naming the file, what is wrong and what to do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnx.external_data_helper
from google.protobuf.message import DecodeError

from ortlstm.graphs.emit.graph_utils import walk_graphs


def load_model_file(path: str | os.PathLike[str], what: str = "model file") -> onnx.ModelProto:
    """The model in the file ``path``, with its external data (the files beside it) loaded.

    Args:
        path: The ``.onnx`` file.
        what: What the file is, for messages (``"model file"``; a training directory's
            ``"training model"``).

    Raises:
        FileNotFoundError: No such file (``IsADirectoryError`` for a directory).
        ValueError: The file is not an ONNX model (it does not parse as one, or parses as an empty
            message: no graph, no opset), or its external data is missing or shorter than the model
            says; the message names the file and, for external data, where it was expected.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: a directory, not a {what} (pass the .onnx file)")
    if not path.is_file():
        raise FileNotFoundError(f"no {what} {str(path)!r}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as error:
        raise ValueError(
            f"{path}: not an ONNX model (protobuf parse failed); pass a .onnx file written by torch.onnx.export or "
            "onnx.save"
        ) from error
    if not model.HasField("graph") or not model.opset_import:
        raise ValueError(
            f"{path}: not an ONNX model (it parses as protobuf but holds no graph or no opset_import); "
            "pass a .onnx file written by torch.onnx.export or onnx.save"
        )
    _check_external_data(model, path)
    if any(_external_tensors(model)):
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
        except (OSError, ValueError, onnx.checker.ValidationError) as error:
            raise ValueError(f"{path}: cannot read its external data ({error})") from None
    return model


def _external_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """The tensors of every graph (initializers, Constant values) whose data lie in another file."""
    for graph in walk_graphs(model.graph):
        tensors = [*graph.initializer]
        for node in graph.node:
            for attribute in node.attribute:
                tensors += [attribute.t] if attribute.HasField("t") else []
                tensors += list(attribute.tensors)
        yield from (tensor for tensor in tensors if onnx.external_data_helper.uses_external_data(tensor))


def _check_external_data(model: onnx.ModelProto, path: Path) -> None:
    """Checks that every external data file the model names is beside it and long enough.

    Raises:
        ValueError: A file is missing or shorter than a tensor's offset and length.
    """
    sizes: dict[str, int | None] = {}
    for tensor in _external_tensors(model):
        info = onnx.external_data_helper.ExternalDataInfo(tensor)
        expected = path.parent / info.location
        if info.location not in sizes:
            sizes[info.location] = expected.stat().st_size if expected.is_file() else None
        size = sizes[info.location]
        if size is None:
            raise ValueError(
                f"{path}: its external data {info.location!r} is missing: expected at {expected.resolve()} "
                "(a torch.onnx.export with dynamo writes the weights beside the .onnx file: copy both)"
            )
        end = (info.offset or 0) + (info.length if info.length is not None else 0)
        if end > size:
            raise ValueError(
                f"{path}: its external data {info.location!r} ({expected.resolve()}) holds {size} bytes, but tensor "
                f"{tensor.name!r} ends at byte {end}: the file is cut short or belongs to another model (copy both "
                "files again)"
            )
