"""The benchmarks run: one round of bench_training.py's Trainer competitors (no timing is checked).

benchmarks/ is where speed is measured, not here; this only keeps its scripts working as the
package changes (a refactor once left the Trainer competitors patching a name that had moved).
Every competitor trains the same model from the same values, so their losses agree.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_training.py"
COMPETITORS = ("trainer", "trainer-stdgrad", "trainer-onnx", "trainer-noguard")


def test_bench_training_runs_every_trainer_competitor(tmp_path: Path) -> None:
    args = ["--configs", "demo,convlstm", "--competitors", ",".join(COMPETITORS), "--repeats", "1"]
    args += ["--max-seconds", "1", "--min-round-seconds", "0", "--json", str(tmp_path / "bench.json")]
    done = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith(("| demo |", "| convlstm |"))]
    timed = {(row[1].strip(), row[3].strip()): row for row in rows if row[3].strip() in COMPETITORS}
    assert set(timed) == {(config, name) for config in ("demo", "convlstm") for name in COMPETITORS}, done.stdout
    for config in ("demo", "convlstm"):
        times = [float(timed[config, name][4]) for name in COMPETITORS]
        assert all(time > 0 for time in times), timed
        losses = {round(float(timed[config, name][-2]), 5) for name in COMPETITORS}
        assert len(losses) == 1, (config, losses)
