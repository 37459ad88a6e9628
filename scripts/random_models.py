"""The larger random-model parity run against torch (issue 31): record with torch, replay without it.

    .venvs/infer/bin/python scripts/random_models.py --count 120 [--out DIR] [--jobs 2]

Records seeds 0 .. count-1 of the grammar (tests/random_model_grammar.py) with the train
environment's torch (tests/recordings/record_random_models.py, ``--train-python``), in ``--jobs``
processes, into ``--out`` (default: a temporary directory; ``--replay-only`` reuses one), then
replays every export in this environment, without torch (tests/random_model_replay.py), and prints
the outcomes (match / refused / warned / export failed / WRONG) by export flavour, by block class
and loss, and each export that did not match with its reason. Exits 1 when any is WRONG.
docs/parity.md has the table of a run.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import random_model_grammar as grammar  # noqa: E402
from random_model_replay import FLAVOURS, Outcome, replay  # noqa: E402

OUTCOMES = ("match", "refused", "warned", "export failed", "WRONG")


def record(seeds: list[int], out: Path, train_python: str, jobs: int) -> None:
    """Records ``seeds`` into ``out`` with torch, in ``jobs`` processes."""
    chunks = [seeds[index::jobs] for index in range(jobs)]
    script = ROOT / "tests" / "recordings" / "record_random_models.py"
    processes = [
        subprocess.Popen(
            [train_python, str(script), "--seeds", ",".join(map(str, chunk)), "--out", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for chunk in chunks
        if chunk
    ]
    for process in processes:
        _, errors = process.communicate()
        if process.returncode:
            raise SystemExit(f"recording failed ({train_python}):\n{errors[-3000:]}")


def replay_all(seeds: list[int], out: Path) -> list[Outcome]:
    """Each seed replayed in each flavour; a crash is an outcome too."""
    results = []
    for seed in seeds:
        for flavour in FLAVOURS:
            try:
                results.append(replay(out, seed, flavour))
            except Exception as error:  # a crash of the replay is a finding, not the end of the run
                results.append(Outcome(seed, flavour, "WRONG", f"crashed: {type(error).__name__}: {error}", {}))
    return results


def _row(label: str, counts: collections.Counter[str]) -> str:
    cells = " | ".join(str(counts.get(outcome, 0)) for outcome in OUTCOMES)
    return f"| {label} | {cells} | {sum(counts.values())} |"


def table(results: list[Outcome]) -> str:
    """Markdown tables: outcomes by flavour, by block class, by loss and optimizer; then the non-matches."""
    header = "| | " + " | ".join(OUTCOMES) + " | exports |\n|---|" + "---|" * (len(OUTCOMES) + 1)
    lines = [f"{len({r.seed for r in results})} models, {len(results)} exports", "", header]
    by_flavour: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    by_class: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for result in results:
        by_flavour[result.flavour][result.outcome] += 1
        by_flavour["all"][result.outcome] += 1
        if result.spec:
            labels = [*grammar.block_classes(result.spec), f"loss {result.spec['loss']}",
                      f"optimizer {result.spec['optimizer']}"]
            for label in labels:
                by_class[label][result.outcome] += 1
    lines += [_row(flavour, by_flavour[flavour]) for flavour in (*FLAVOURS, "all")]
    lines += ["", "By block class, loss and optimizer (an export counts under each class it has):", "", header]
    lines += [_row(label, by_class[label]) for label in sorted(by_class)]
    lines += ["", "Not matched:", ""]
    for result in results:
        if result.outcome != "match":
            reason = " ".join(result.reason.split())
            lines.append(f"- seed {result.seed} {result.flavour}: {result.outcome}: {reason[:220]}")
    return "\n".join(lines)


def main() -> int:
    """The command line: records, replays and prints the outcomes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=120, help="seeds 0 .. count-1 (default 120)")
    parser.add_argument("--out", help="where the recordings go (default: a temporary directory)")
    parser.add_argument("--train-python", default=str(ROOT / ".venvs" / "train" / "bin" / "python"),
                        help="a Python with torch 2.13 (default: .venvs/train/bin/python)")
    parser.add_argument("--jobs", type=int, default=2, help="recording processes (default 2)")
    parser.add_argument("--replay-only", action="store_true", help="replay the recordings already in --out")
    args = parser.parse_args()
    if args.replay_only and not args.out:
        parser.error("--replay-only needs --out, the directory of an earlier run's recordings")
    seeds = list(range(args.count))
    with tempfile.TemporaryDirectory() as temporary:
        out = Path(args.out or temporary)
        out.mkdir(parents=True, exist_ok=True)
        if not args.replay_only:
            record(seeds, out, args.train_python, max(1, args.jobs))
        missing = [seed for seed in seeds if not (out / f"{seed}.npz").exists()]
        if missing:
            parser.error(f"--out {out} has no recording of seeds {missing[:10]}; run without --replay-only")
        results = replay_all(seeds, out)
    print(table(results))
    return 1 if any(result.outcome == "WRONG" for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
