"""Times two builds of the kernel library against each other, interleaved in one process.

A refactor of the recurrent time loop must keep its speed: this runs the pairs of
benchmarks/bench_lstm.py (IO binding; its ``--cells``): LSTMTraining + LSTMGrad, GRUTraining +
GRUGrad and RNNTraining + RNNGrad (kinds rnn and rnn-relu) from library A and library B, each
registered with its own session, the rounds alternating A, B, B, A, ... so that drift in clock speed or
background load hits both alike. Prints, per config, the median f+b of each and B / A with the
spread (min..max of the per-round ratios). Usage:

    python scripts/ab_kernel_libraries.py OLD.so NEW.so --threads 1 --configs S M B1 M-bidir
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_lstm

import ortlstm.ops.library


def _runner(kind: str, library: str, name: str, threads: int) -> Callable[[], None]:
    """One f+b call of `kind` ("lstm", "gru", "rnn", "rnn-relu") from `library` at config `name`."""
    ortlstm.ops.library.library_path = lambda: library  # type: ignore[assignment]
    cell = "rnn_relu" if kind == "rnn-relu" else kind  # bench_cells.py's cell names
    runner = bench_lstm.OrtRunner("ortlstm", bench_lstm.cell_config(bench_lstm.CONFIGS[name], cell), threads)
    phases: bench_lstm.Phases = {}
    return lambda: runner.iteration(phases)


def main() -> int:
    """Times the two libraries in alternating rounds; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--kinds", nargs="+", default=["lstm", "gru"], choices=["lstm", "gru", "rnn", "rnn-relu"])
    parser.add_argument("--configs", nargs="+", default=["S", "M", "B1", "M-bidir"])
    args = parser.parse_args()
    for kind in args.kinds:
        for name in args.configs:
            runs = [_runner(kind, args.old, name, args.threads), _runner(kind, args.new, name, args.threads)]
            for run in runs:
                run()
            times: list[list[float]] = [[], []]
            for round_index in range(args.rounds):
                order = (0, 1) if round_index % 2 == 0 else (1, 0)
                for which in order:
                    start = time.perf_counter()
                    runs[which]()
                    times[which].append(time.perf_counter() - start)
            ratios = [b / a for a, b in zip(times[0], times[1], strict=True)]
            old, new = statistics.median(times[0]), statistics.median(times[1])
            print(
                f"{kind} {name} t{args.threads}: A {old * 1e3:.3f} ms, B {new * 1e3:.3f} ms, B/A {new / old:.3f} "
                f"(per-round {min(ratios):.2f}..{max(ratios):.2f})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
