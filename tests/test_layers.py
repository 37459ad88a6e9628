"""The package's layers import only downward (docs/architecture.md), read from the source.

Every module of ``ops/``, ``graphs/`` and ``ortlstm/`` is parsed (no import runs): ``import``
statements at any depth and ``importlib.import_module("...")`` with a literal name. The rules:

- The op contract (``ortlstm.ops.schema`` and the modules it gathers) is pure data: the standard
  library and each other only.
- ``ortlstm.ops`` imports no other part of ortlstm.
- ``ortlstm.graphs`` imports only ``ortlstm.ops`` and itself, and never onnxruntime except in the
  modules of the onnxruntime-training 1.19.2 path.
- Its ground floor, ``ortlstm.graphs.emit`` (the emitter, the schema checks, the graph plumbing),
  imports only ``ortlstm.ops`` and itself; no module of the package imports the old names kept for
  code outside it (``ortlstm.graphs.autodiff.emitter``, ``ortlstm.graphs.graph_utils``,
  ``ortlstm.graphs.autodiff.rules_sequence``).
- No module imports torch; only the 1.19.2 path imports ``onnxruntime.training``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ortlstm
import ortlstm.graphs
import ortlstm.ops

PACKAGES = {
    "ortlstm.ops": Path(ortlstm.ops.__file__).parent,
    "ortlstm.graphs": Path(ortlstm.graphs.__file__).parent,
    "ortlstm": Path(ortlstm.__file__).parent,
}
# The onnxruntime-training 1.19.2 path: generate_artifacts, the LSTMGrad gradient registration, the
# import of its checkpoints into the Trainer (ortlstm.ort_training), and the CLI's `artifacts` command
# (lazily, in its function).
ONNXRUNTIME_TRAINING_PATH = {
    "ortlstm.graphs.ort_training.artifacts",
    "ortlstm.graphs.ort_training.gradient",
    "ortlstm.ort_training.checkpoint",
    "ortlstm.ort_training.importer",
    "ortlstm.__main__",
}


# The ground floor every builder of graphs imports, and the old module names that re-export it.
GROUND_FLOOR = "ortlstm.graphs.emit"
KEPT_FOR_OUTSIDE = {
    "ortlstm.graphs.autodiff.emitter": "ortlstm.graphs.emit.emitter",
    "ortlstm.graphs.graph_utils": "ortlstm.graphs.emit.graph_utils",
    "ortlstm.graphs.autodiff.rules_sequence": "ortlstm.graphs.prepare.sequences",
}

# ops/schema.py gathers the declarations of these modules.
CONTRACT = {
    "ortlstm.ops.schema",
    "ortlstm.ops.contract",
    "ortlstm.ops.wiring",
    "ortlstm.ops.family",
    "ortlstm.ops.spec_lstm",
    "ortlstm.ops.spec_gru",
    "ortlstm.ops.spec_rnn",
    "ortlstm.ops.spec_optimizers",
    "ortlstm.ops.spec_ctc",
    "ortlstm.ops.spec_gradients",
}


def modules() -> Iterator[tuple[str, Path]]:
    """(module name, file) for every module of the package, each once."""
    seen: set[Path] = set()
    for package, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            resolved = path.resolve()
            if resolved in seen or "__pycache__" in path.parts:
                continue
            seen.add(resolved)
            relative = path.relative_to(root).with_suffix("").parts
            parts = relative[:-1] if relative[-1] == "__init__" else relative
            name = ".".join((package, *parts))
            if package == "ortlstm" and name.split(".")[1:2] in (["ops"], ["graphs"]):
                continue  # a link to ops/ or graphs/ inside a development checkout
            yield name, path


def imported(path: Path) -> set[str]:
    """The absolute module names a file imports, at any depth, including import_module literals."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


MODULES = dict(modules())


def test_every_layer_is_found() -> None:
    assert set(MODULES) >= CONTRACT
    assert any(within(name, "ortlstm.graphs.autodiff") for name in MODULES)
    assert {GROUND_FLOOR, f"{GROUND_FLOOR}.emitter", f"{GROUND_FLOOR}.checks", *KEPT_FOR_OUTSIDE} <= set(MODULES)
    assert any(within(name, "ortlstm.training") for name in MODULES)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_only_downward(name: str) -> None:
    imports = imported(MODULES[name])
    wrong = []
    if name in CONTRACT:
        ours = {i for i in imports if i in CONTRACT or i.rsplit(".", 1)[0] in CONTRACT}
        wrong += [i for i in imports - ours if i.split(".")[0] not in sys.stdlib_module_names | {"__future__"}]
    if within(name, "ortlstm.ops"):
        wrong += [i for i in imports if within(i, "ortlstm") and not within(i, "ortlstm.ops")]
    if within(name, "ortlstm.graphs"):
        ours = [i for i in imports if within(i, "ortlstm")]
        wrong += [i for i in ours if not (within(i, "ortlstm.ops") or within(i, "ortlstm.graphs"))]
        if name not in ONNXRUNTIME_TRAINING_PATH:
            wrong += [i for i in imports if within(i, "onnxruntime")]
    if within(name, GROUND_FLOOR):
        ours = [i for i in imports if within(i, "ortlstm")]
        wrong += [i for i in ours if not (within(i, "ortlstm.ops") or within(i, GROUND_FLOOR))]
    if name not in KEPT_FOR_OUTSIDE:
        old_names = [(i, new) for old, new in KEPT_FOR_OUTSIDE.items() for i in imports if within(i, old)]
        wrong += [f"{i} (import {new})" for i, new in old_names]
    wrong += [i for i in imports if within(i, "torch")]
    if name not in ONNXRUNTIME_TRAINING_PATH:
        wrong += [i for i in imports if within(i, "onnxruntime.training")]
    assert not wrong, f"{name} imports {sorted(set(wrong))} (docs/architecture.md: the layers and their imports)"
