"""sgemm on the LSTM's shapes, per BLAS: which backend should ortlstm use on this CPU?

Times C = op(A) · op(B) (row-major, the transposes the kernels use) at the shapes one task of
LSTMTraining / LSTMGrad runs with 2 ORT threads (per-step recurrent GEMM, input projection, the
backward's window GEMMs; see docs/performance.md), each BLAS single-threaded as the kernels call
it, plus the whole (unsplit) shapes with the BLAS's own 2 threads. BLASes:

- ``openblas``: scipy-openblas32 (``scipy_cblas_sgemm``), the library ortlstm links (ctypes).
- ``mkl``: oneMKL through ``libmkl_rt`` when ``--mkl-rt`` names one (``pip install mkl==<the
  version in pyproject.toml>`` into any environment gives the same oneMKL ortlstm links
  statically), plain and with B packed once (``cblas_sgemm_pack``/``compute``, as the forward's
  time loop uses it).
- ``torch.mm`` (PyTorch's oneMKL) and ``numpy.matmul`` (numpy's OpenBLAS) when importable.

``--bf16`` times the bf16 GEMM limit instead (issue 33): the kernel library's own GEMMs through
its ctypes probe (kernels_cpp/common/bf16_probe.cc), one thread as a kernel task calls them, at the
LSTM's shapes (BF16_SHAPES): its float32 GEMM, the bf16 GEMM alone on operands already in bfloat16
(the limit), the same with both operands rounded per call, and a Bf16Operand (B rounded and packed
once, A per call, as the recurrent driver will use it); with torch, ``a @ b`` in float32 and bfloat16
(oneDNN). The bf16 backend is the process's: run once per ``ORTLSTM_BF16_GEMM=mkl|onednn|fallback``
(interleave the runs). ``--tasks 2`` runs every call in 2 threads at once, each on its own operands,
as two ORT executor tasks of one op call would (``Bf16Operand x64``: a time loop's 64 step GEMMs with
its construction, per step).

Medians of interleaved repetitions; prints a markdown table. Usage:
    python benchmarks/bench_gemm.py [--mkl-rt /path/libmkl_rt.so.2] [--threads 1,2] [--bf16]
Thread variables are fixed before any BLAS loads (the script re-executes itself once).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from collections.abc import Callable

_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

# (config, what, M, N, K, trans_a, trans_b): one task's GEMM with 2 ORT threads.
SHAPES = [
    ("S", "fwd step (whole batch)", 8, 256, 64, False, True),
    ("M", "fwd step, group of 16 rows", 16, 1024, 256, False, True),
    ("M", "fwd step, block of 128 units", 32, 512, 256, False, True),
    ("M", "projection, half the rows", 1024, 1024, 256, False, True),
    ("M", "bwd step, group of 16 rows", 16, 256, 1024, False, False),
    ("M", "window dW/dR, half of 4H", 512, 256, 512, True, False),
    ("M", "window dX, half the rows", 256, 256, 1024, False, False),
    ("L", "fwd step, block of 256 units", 64, 1024, 512, False, True),
    ("L", "projection, half the rows", 4096, 2048, 512, False, True),
    ("L", "bwd step, block of 256 units", 64, 256, 2048, False, False),
    ("L", "window dW/dR, half of 4H", 1024, 512, 512, True, False),
    ("L", "window dX, half the rows", 256, 512, 2048, False, False),
    ("B1", "fwd step, whole", 1, 512, 128, False, True),
]
# Whole shapes for the 2-thread rates (the GEMM limit's kind of number).
WHOLE = [
    ("M", "projection", 2048, 1024, 256, False, True),
    ("M", "window dW", 1024, 256, 512, True, False),
    ("L", "projection", 8192, 2048, 512, False, True),
    ("L", "window dW", 2048, 512, 512, True, False),
    ("-", "square 1024", 1024, 1024, 1024, False, False),
]

# The LSTM's whole GEMMs (issue 33's yardstick shapes): (config, what, M, N, K, trans_a, trans_b).
BF16_SHAPES = [
    ("M", "recurrent step", 32, 1024, 256, False, True),
    ("M", "input projection", 2048, 1024, 256, False, True),
    ("L", "recurrent step", 64, 2048, 512, False, True),
    ("L", "input projection", 8192, 2048, 512, False, True),
]

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
MKL_B_MATRIX, MKL_PACKED = 162, 151


def _fix_threads(threads: int) -> None:
    wanted = str(threads)
    if all(os.environ.get(name) == wanted for name in _THREAD_ENV):
        return
    for name in _THREAD_ENV:
        os.environ[name] = wanted
    os.execv(sys.executable, [sys.executable, *sys.argv])


class Cblas:
    """A CBLAS sgemm through ctypes; ``prefix`` is ``scipy_`` for scipy-openblas32."""

    def __init__(self, name: str, path: str, prefix: str, set_threads: str) -> None:
        self.name = name
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        self.sgemm = getattr(self.lib, f"{prefix}cblas_sgemm")
        self.set_threads = getattr(self.lib, set_threads)

    def threads(self, count: int) -> None:
        """Sets the library's own thread count."""
        self.set_threads(ctypes.c_int(count))


def _operands(np, m: int, n: int, k: int, ta: bool, tb: bool):  # noqa: ANN001, ANN202
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c = np.zeros((m, n), dtype=np.float32)
    return a, b, c


def cblas_call(np, blas: Cblas, m, n, k, ta, tb) -> Callable[[], None]:  # noqa: ANN001
    """One row-major sgemm through a CBLAS, as a callable."""
    a, b, c = _operands(np, m, n, k, ta, tb)
    p = ctypes.c_void_p
    args = (
        ROW_MAJOR,
        TRANS if ta else NO_TRANS,
        TRANS if tb else NO_TRANS,
        m,
        n,
        k,
        ctypes.c_float(1.0),
        p(a.ctypes.data),
        a.shape[1],
        p(b.ctypes.data),
        b.shape[1],
        ctypes.c_float(0.0),
        p(c.ctypes.data),
        n,
    )

    def run() -> None:
        blas.sgemm(*args)

    run.keep = (a, b, c)  # type: ignore[attr-defined]
    return run


def mkl_packed_call(np, blas: Cblas, m, n, k, ta, tb) -> Callable[[], None]:  # noqa: ANN001
    """One sgemm through oneMKL's packed API, B packed once up front, as a callable."""
    a, b, c = _operands(np, m, n, k, ta, tb)
    lib = blas.lib
    lib.cblas_sgemm_pack_get_size.restype = ctypes.c_size_t
    size = lib.cblas_sgemm_pack_get_size(MKL_B_MATRIX, m, n, k)
    packed = np.empty(size // 4 + 16, dtype=np.float32)
    p = ctypes.c_void_p
    lib.cblas_sgemm_pack(
        ROW_MAJOR,
        MKL_B_MATRIX,
        TRANS if tb else NO_TRANS,
        m,
        n,
        k,
        ctypes.c_float(1.0),
        p(b.ctypes.data),
        b.shape[1],
        p(packed.ctypes.data),
    )
    args = (
        ROW_MAJOR,
        TRANS if ta else NO_TRANS,
        MKL_PACKED,
        m,
        n,
        k,
        p(a.ctypes.data),
        a.shape[1],
        p(packed.ctypes.data),
        n,
        ctypes.c_float(0.0),
        p(c.ctypes.data),
        n,
    )

    def run() -> None:
        lib.cblas_sgemm_compute(*args)

    run.keep = (a, b, c, packed)  # type: ignore[attr-defined]
    return run


def torch_call(np, torch, m, n, k, ta, tb) -> Callable[[], None]:  # noqa: ANN001
    """One torch.mm into a preallocated output, as a callable."""
    a, b, c = (torch.from_numpy(x) for x in _operands(np, m, n, k, ta, tb))
    a = a.t() if ta else a
    b = b.t() if tb else b

    def run() -> None:
        torch.mm(a, b, out=c)

    return run


def numpy_call(np, m, n, k, ta, tb) -> Callable[[], None]:  # noqa: ANN001
    """One numpy.matmul into a preallocated output, as a callable."""
    a, b, c = _operands(np, m, n, k, ta, tb)
    a = a.T if ta else a
    b = b.T if tb else b

    def run() -> None:
        np.matmul(a, b, out=c)

    return run


def ortlstm_calls(np, m, n, k, ta, tb) -> dict[str, Callable[[], None]]:  # noqa: ANN001
    """The kernel library's float32 and bf16 GEMMs at one shape (OrtLstmGemmBf16's modes), as callables."""
    import ortlstm.ops

    backend = ortlstm.ops.bf16_gemm_backend()  # also loads the BLAS the library links
    lib = ctypes.CDLL(ortlstm.ops.library_path())
    gemm, round_bits = lib.OrtLstmGemmBf16, lib.OrtLstmRoundToBfloat16
    i64, p = ctypes.c_int64, ctypes.c_void_p
    gemm.argtypes = [ctypes.c_int] * 3 + [i64] * 3 + [ctypes.c_float, p, i64, p, i64, ctypes.c_float, p, i64]
    round_bits.argtypes = [p, p, i64]
    a, b, c = _operands(np, m, n, k, ta, tb)
    a16, b16 = np.empty(a.shape, np.uint16), np.empty(b.shape, np.uint16)
    round_bits(a.ctypes.data, a16.ctypes.data, a.size)
    round_bits(b.ctypes.data, b16.ctypes.data, b.size)

    def call(mode: int, x, y) -> Callable[[], None]:  # noqa: ANN001
        args = (mode, int(ta), int(tb), m, n, k, 1.0, x.ctypes.data, x.shape[1], y.ctypes.data, y.shape[1], 0.0,
                c.ctypes.data, n)
        run = lambda: gemm(*args)  # noqa: E731
        run.keep = (x, y, c)  # type: ignore[attr-defined]
        return run

    calls = {
        "ortlstm float32": call(3, a, b),
        f"bf16 GEMM ({backend})": call(1, a16, b16),
        "bf16, both rounded": call(0, a, b),
        "Bf16Operand x2": call(2, a, b),  # constructs (rounds and packs B) once, multiplies twice
    }
    if m <= 256:  # a step GEMM: once, then 64 multiplies, as in one op call (a projection runs once per call)
        calls["Bf16Operand x64"] = call(5, a, b)
    return calls


def in_tasks(calls: list[dict[str, Callable[[], None]]], pool) -> dict[str, Callable[[], None]]:  # noqa: ANN001
    """Each name's calls (one per task) run at once, one in this thread and the rest in ``pool``."""

    def together(runs: list[Callable[[], None]]) -> Callable[[], None]:
        def run() -> None:
            pending = [pool.submit(other) for other in runs[1:]]
            runs[0]()
            for future in pending:
                future.result()

        return run

    return {name: together([task[name] for task in calls]) for name in calls[0]}


def torch_bf16_calls(np, torch, m, n, k, ta, tb) -> dict[str, Callable[[], None]]:  # noqa: ANN001
    """The float32 and bfloat16 ``a @ b`` of torch (oneDNN) at one shape."""
    a, b, _ = (torch.from_numpy(x) for x in _operands(np, m, n, k, ta, tb))
    a, b = (a.t() if ta else a), (b.t() if tb else b)
    a16, b16 = a.bfloat16(), b.bfloat16()
    return {"torch float32": lambda: a @ b, "torch bf16": lambda: a16 @ b16}


def bf16_table(np, torch, rounds: int, min_seconds: float, tasks: int = 1) -> None:  # noqa: ANN001
    """The bf16 GEMM limit at BF16_SHAPES: time per call and GFLOP/s (of all tasks together)."""
    from concurrent.futures import ThreadPoolExecutor

    names: list[str] = []
    rows = []
    timed = []
    pool = ThreadPoolExecutor(max(1, tasks - 1))
    for config, what, m, n, k, ta, tb in BF16_SHAPES:
        calls = in_tasks([ortlstm_calls(np, m, n, k, ta, tb) for _ in range(tasks)], pool)
        if torch is not None and tasks == 1:
            torch.set_num_threads(1)
            calls.update(torch_bf16_calls(np, torch, m, n, k, ta, tb))
        seconds = median_seconds(calls, rounds, min_seconds)
        seconds["Bf16Operand x2"] /= 2
        if "Bf16Operand x64" in seconds:
            seconds["Bf16Operand x64"] /= 64
        names += [name for name in seconds if name not in names]
        timed.append((f"| {config} | {what} | {m} x {n} x {k} | ", 2.0 * m * n * k * tasks, seconds))
    pool.shutdown()
    for head, flops, seconds in timed:
        cells = [f"{1e6 * seconds[name]:.0f} us, {flops / seconds[name] / 1e9:.0f}" if name in seconds else "-"
                 for name in names]
        rows.append(head + " | ".join(cells) + " |")
    print(f"\n{tasks} task(s) of 1 thread each, at once: time per call, GFLOP/s of all tasks (Bf16Operand: per "
          "multiply, its construction included once per two or per 64)\n")
    print("| config | GEMM | M x N x K | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---:|" * len(names))
    print("\n".join(rows))


def median_seconds(calls: dict[str, Callable[[], None]], rounds: int, min_seconds: float) -> dict[str, float]:
    """Interleaved rounds; each round runs each call enough times to last ``min_seconds``."""
    reps = {}
    for name, run in calls.items():
        run()
        start, count = time.perf_counter(), 0
        while time.perf_counter() - start < min_seconds:
            run()
            count += 1
        reps[name] = max(1, count)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):
        names = list(calls)
        names = names[r % len(names) :] + names[: r % len(names)]
        for name in names:
            start = time.perf_counter()
            for _ in range(reps[name]):
                calls[name]()
            samples[name].append((time.perf_counter() - start) / reps[name])
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    """Parses the arguments, times every BLAS at every shape, prints the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mkl-rt", default=None, help="path of libmkl_rt.so.2 (oneMKL's single dynamic library)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--min-seconds", type=float, default=0.02, help="per call and round")
    parser.add_argument("--threads", type=int, default=2, help="threads for the whole-shape table")
    parser.add_argument("--bf16", action="store_true", help="the bf16 GEMM limit table (one thread) instead")
    parser.add_argument("--tasks", type=int, default=1, help="--bf16: single-threaded calls run at once")
    args = parser.parse_args()
    _fix_threads(1 if args.bf16 else args.threads)

    import numpy as np

    blases: list[Cblas] = []
    try:
        import scipy_openblas32

        path = os.path.join(scipy_openblas32.get_lib_dir(), f"lib{scipy_openblas32.get_library()}.so")
        blases.append(Cblas("openblas", path, "scipy_", "scipy_openblas_set_num_threads"))
    except ImportError:
        pass
    if args.mkl_rt:
        blases.append(Cblas("mkl", args.mkl_rt, "", "MKL_Set_Num_Threads"))
    try:
        import torch
    except ImportError:
        torch = None

    cpu = open("/proc/cpuinfo").read().split("\n\n")[0]  # noqa: SIM115
    fields = dict(line.split(":", 1) for line in cpu.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set(fields.get("flags", "").split())
    print(
        f"CPU: {fields.get('model name')} ({fields.get('vendor_id')}, family {fields.get('cpu family')}, model "
        f"{fields.get('model')}); SIMD: {' '.join(f for f in ('avx2', 'fma', 'avx512f') if f in flags)}"
    )
    for blas in blases:
        if blas.name == "openblas":
            blas.lib.scipy_openblas_get_config.restype = ctypes.c_char_p
            blas.lib.scipy_openblas_get_corename.restype = ctypes.c_char_p
            print(
                f"openblas: {blas.lib.scipy_openblas_get_config().decode()}, core "
                f"{blas.lib.scipy_openblas_get_corename().decode()}"
            )
        else:
            buffer = ctypes.create_string_buffer(256)
            blas.lib.MKL_Get_Version_String(buffer, 256)
            print(f"mkl: {buffer.value.decode()}")
    if torch is not None:
        print(f"torch {torch.__version__}: {torch.__config__.show().splitlines()[3:5]}")
    print(f"numpy {np.__version__}; load average before: {os.getloadavg()}")
    if args.bf16:
        print(f"bf16 flags: {' '.join(f for f in ('avx512_bf16', 'amx_bf16', 'amx_tile') if f in flags) or 'none'}")
        bf16_table(np, torch, args.rounds, args.min_seconds, args.tasks)
        print(f"\nload average after: {os.getloadavg()}")
        return

    def table(shapes: list[tuple], threads: int) -> None:
        names: list[str] = []
        rows = []
        for config, what, m, n, k, ta, tb in shapes:
            calls: dict[str, Callable[[], None]] = {}
            for blas in blases:
                blas.threads(threads)
                calls[blas.name] = cblas_call(np, blas, m, n, k, ta, tb)
                if blas.name == "mkl" and threads == 1:
                    calls["mkl packed B"] = mkl_packed_call(np, blas, m, n, k, ta, tb)
            if torch is not None:
                torch.set_num_threads(threads)
                calls["torch.mm"] = torch_call(np, torch, m, n, k, ta, tb)
            if threads == args.threads:
                calls["numpy"] = numpy_call(np, m, n, k, ta, tb)
            seconds = median_seconds(calls, args.rounds, args.min_seconds)
            names = list(seconds)
            flops = 2.0 * m * n * k
            best = min(seconds.values())
            cells = [f"{1e6 * s:.0f} us, {flops / s / 1e9:.0f}" + ("**" if s == best else "") for s in seconds.values()]
            t = ("A^T " if ta else "") + ("B^T" if tb else "")
            rows.append(f"| {config} | {what} | {m} x {n} x {k} {t} | " + " | ".join(cells) + " |")
        print(f"\n{threads} thread(s): time per call, GFLOP/s (** fastest)\n")
        print("| config | GEMM | M x N x K | " + " | ".join(names) + " |")
        print("|---|---|---|" + "---:|" * len(names))
        print("\n".join(rows))

    table(SHAPES, 1)
    table(WHOLE, args.threads)
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
