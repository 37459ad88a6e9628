"""How far apart two CPUs are, over time: the round trip of a cache line between them, in ns.

On a VM the figure moves when the host moves the vCPUs (docs/performance.md: 56 against about 320 ns
on the 2-vCPU AMD Zen 4), and the kernels' small sizes, which hand data between cores every time
step, move with it: run it beside a measurement to tell the states apart (benchmarks/bench_lstm.py
records it per config). Linux only; the probe is the kernel library's OrtLstmCoreRoundTripNs
(kernels_cpp/common/core_probe.cc).

    python scripts/core_round_trip.py [--seconds 10] [--cpus 0 1]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time

import ortlstm.ops


def main(argv: list[str] | None = None) -> int:
    """Prints the round trip every half second for ``--seconds``; 1 if it cannot be measured."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to keep measuring (default 10)")
    parser.add_argument("--cpus", type=int, nargs=2, default=(0, 1), metavar=("A", "B"), help="default: 0 1")
    args = parser.parse_args(argv)
    probe = ctypes.CDLL(ortlstm.ops.library_path()).OrtLstmCoreRoundTripNs
    probe.restype = ctypes.c_double
    probe.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_double]
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        ns = probe(args.cpus[0], args.cpus[1], 0.5)
        if ns < 0:
            print(f"cannot measure between CPUs {args.cpus[0]} and {args.cpus[1]} (not both ours, or not Linux)")
            return 1
        print(f"{time.strftime('%H:%M:%S')} {ns:.0f} ns", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
