"""``scripts/demo.sh``: installs once, reuses an environment that is up to date, writes where git ignores.

The script runs from a copy of the checkout's layout in a temporary directory, with a stand-in
environment whose ``python`` logs each ``pip install`` and whose ``ortlstm`` logs its arguments, so
that what the script decides (install or reuse) is seen without building anything.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "CMakeLists.txt", "cmake/a.cmake", "kernels_cpp/k.cc", "ops/o.py", "graphs/g.py")


def checkout(tmp_path: Path) -> Path:
    """A checkout's layout: scripts/demo.sh, a file of each kind it builds from, and a stand-in .venvs/demo."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "demo.sh", tmp_path / "scripts" / "demo.sh")
    for name in (*SOURCES, "src/ortlstm/__init__.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"{name}\n")
    bin_dir = tmp_path / ".venvs" / "demo" / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "log.txt"
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "python $*" >> {log}\n')
    (bin_dir / "ortlstm").write_text(f'#!/bin/sh\n[ "$1" = --version ] && exit 0\necho "ortlstm $*" >> {log}\n')
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    return tmp_path


def demo_sh(root: Path, *args: str, **env: str) -> list[str]:
    """Runs the copy's demo.sh; the lines its stand-ins logged."""
    log = root / "log.txt"
    log.unlink(missing_ok=True)
    result = subprocess.run(
        ["bash", str(root / "scripts" / "demo.sh"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", **env},
    )
    assert result.returncode == 0, result.stderr
    return log.read_text().splitlines()


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("sha256sum") is None, reason="bash, coreutils")
def test_demo_sh_installs_once_and_reinstalls_only_when_a_source_changes(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    out = root / "runs" / "demo"
    install = ["python -m pip install -q --upgrade pip", "python -m pip install -q .[demo]"]
    run = f"ortlstm demo --out {out}/ortlstm_demo.onnx --plot {out}/ortlstm_demo.png --epochs 1"
    assert demo_sh(root, "--epochs", "1") == [*install, run]  # no stamp yet
    assert demo_sh(root, "--epochs", "1") == [run]  # up to date: no pip
    assert out.is_dir()
    for name in SOURCES:  # any file the install is built from
        (root / name).write_text("changed\n")
        assert demo_sh(root, "--epochs", "1") == [*install, run], name
        assert demo_sh(root, "--epochs", "1") == [run], name
    (root / "src" / "ortlstm" / "__pycache__").mkdir()
    (root / "src" / "ortlstm" / "__pycache__" / "x.pyc").write_bytes(b"\0")  # not a source
    assert demo_sh(root, "--epochs", "1") == [run]
    assert demo_sh(root, "--epochs", "1", ORTLSTM_DEMO_REINSTALL="1") == [*install, run]
    other = root / "elsewhere"
    assert demo_sh(root, ORTLSTM_DEMO_DIR=str(other)) == [
        f"ortlstm demo --out {other}/ortlstm_demo.onnx --plot {other}/ortlstm_demo.png"
    ]


def test_git_ignores_the_demo_outputs() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")
    paths = ["runs/demo/ortlstm_demo.onnx", "runs/demo/ortlstm_demo.png", "ortlstm_demo.onnx", "ortlstm_ocr.png"]
    result = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", *paths], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.stdout.split() == paths
