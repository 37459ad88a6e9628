"""The README's Python snippet runs as a user runs it: a script beside README.md, in the checkout's root.

The package's source lives under ``src/``, so nothing in the checkout's root shadows the installed
package (before, ``ortlstm/`` there hid ``ortlstm.graphs`` and ``ortlstm.ops``, which exist only in
the installed package: ``No module named 'ortlstm.graphs'``). The snippet is read from README.md
itself, its file names pointed to a temporary directory and ``batches`` defined, and run with
``python -`` from the root, where the current directory comes first on ``sys.path``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_fit import rule_data, write_example

ROOT = Path(__file__).resolve().parents[1]


def readme_trainer_snippet() -> str:
    """The README's first Python block that makes a Trainer."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)
    return next(block for block in blocks if "from ortlstm.training import Trainer" in block)


def run_from_root(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-"], input=code, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_readmes_trainer_snippet_runs_from_the_checkouts_root(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    write_example(tmp_path)
    snippet = readme_trainer_snippet()
    for name in ("model.onnx", "run.safetensors", "trained.onnx"):
        assert f'"{name}"' in snippet, name
        snippet = snippet.replace(f'"{name}"', repr(str(tmp_path / name)))
    data = rule_data(64, 0)
    prologue = (
        "import numpy as np\n"
        f"data = np.load({str(tmp_path / 'data.npz')!r})\n"
        "batches = [(data['pixels'][i:i + 16], data['target'][i:i + 16]) for i in range(0, 64, 16)]\n"
    )
    np.savez(tmp_path / "data.npz", **data)
    done = run_from_root(prologue + snippet + "print('final loss', float(loss))\n")
    assert done.returncode == 0, done.stderr
    assert "final loss" in done.stdout
    assert (tmp_path / "trained.onnx").stat().st_size > 0
    assert (tmp_path / "run.safetensors").stat().st_size > 0


def test_the_package_and_its_command_import_the_same_from_the_checkouts_root() -> None:
    """``python -m ortlstm`` and every subpackage from the root: the installed package, not a source folder."""
    done = run_from_root(
        "import ortlstm, ortlstm.graphs, ortlstm.ops, ortlstm.training, ortlstm.fit\n"
        "from pathlib import Path\n"
        "print(Path(ortlstm.ops.library_path()).is_file())\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    version = subprocess.run(
        [sys.executable, "-m", "ortlstm", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("ortlstm ")

