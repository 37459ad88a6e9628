"""bench_lstm.py's machinery (no timing is checked): the GEMM limit's precision, the cells' pairs and targets.

benchmarks/ is where speed is measured; this keeps the report honest as the script grows. The GEMM
limit must come from GEMMs of the config's own precision (a bf16 GEMM once set the float32 limit
of a run without torch); ``--cells gru,rnn`` must time the right pair of ops, whose gradients are
checked here against float64 central differences of their forward (the stash really is wired from
the forward to the gradient op); the targets table must name each cell's rows.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_lstm
from bench_cells import CELLS, short_name_argv


class _FakeGemm(bench_lstm.GemmSource):
    """A GEMM that only waits: ``seconds`` per call, so the rates are known without a BLAS."""

    def __init__(self, name: str, seconds: float, operands: str) -> None:
        self.name, self._seconds, self.operands = name, seconds, operands

    def prepare(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Callable[[], None]:
        return lambda: time.sleep(self._seconds)


def test_float32_limit_takes_float32_gemms_only() -> None:
    native = _FakeGemm("native float32, 2 threads", 2e-3, "native")
    rounded = _FakeGemm("bf16 GEMM, 1 thread", 0.0, "bfloat16")  # far the fastest: it must still not count
    candidates, rows = bench_lstm.measure_gemm_rates([rounded, native], [bench_lstm.CONFIGS["S"]], quick=True)
    assert {c.source.name for c in candidates["float32"]} == {native.name}
    assert {(dtype, source) for dtype, _, source, _ in rows} == {("float32", native.name), ("bfloat16", rounded.name)}
    with pytest.raises(ValueError, match=r"native-precision GEMMs only, got \['bf16 GEMM, 1 thread'\]"):
        bench_lstm.GemmLimitRunner([bench_lstm.GemmCandidate(rounded, 4, 4, 4, "float32")])


def test_cell_configs_names_and_flops() -> None:
    m = bench_lstm.CONFIGS["M"]
    gru, rnn = bench_lstm.cell_config(m, "gru"), bench_lstm.cell_config(m, "rnn")
    assert bench_lstm.cell_config(m, "lstm") is m
    assert (gru.name, rnn.name, gru.gates, rnn.gates, m.gates) == ("gru-M", "rnn-M", 3, 1, 4)
    t, n, i, h = 64, 32, 256, 256
    assert gru.forward_flops == 2 * t * n * 3 * h * (i + h)
    assert gru.backward_flops == 2 * t * n * 3 * h * 2 * (i + h)
    assert rnn.forward_flops == 2 * t * n * h * (i + h)
    assert bench_lstm.config_by_name("gru-M-bidir") == bench_lstm.cell_config(bench_lstm.CONFIGS["M-bidir"], "gru")
    assert bench_lstm.config_by_name("rnn_relu-B1").cell == "rnn_relu"
    assert bench_lstm.config_by_name("M-bidir") is bench_lstm.CONFIGS["M-bidir"]


def _loss_and_gradients(runner: bench_lstm.OrtRunner, cell: str, x: np.ndarray) -> tuple[float, dict]:
    """sum(grad_HAll * HAll) + sum(grad_Ht * Ht) at X = x, and the pair's gradients at the runner's X."""
    spec = CELLS[cell]
    feeds = runner._feeds
    forward = runner._forward_session.run(list(spec.forward_outputs), {**runner._forward_feeds, "X": x})
    outputs = dict(zip(spec.forward_outputs, forward, strict=True))
    loss = float(np.sum(feeds["grad_HAll"] * outputs["HAll"]) + np.sum(feeds["grad_Ht"] * outputs["Ht"]))
    backward = runner._backward_session.run(list(spec.gradient_outputs), runner._backward_feeds)
    gradients = dict(zip(spec.gradient_outputs, backward, strict=True))
    return loss, gradients


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn", "rnn_relu"])
def test_cell_pair_gradients_match_finite_differences(cell: str) -> None:
    tiny = bench_lstm.BenchConfig("tiny", 3, 2, 4, 5, direction="bidirectional", dtype="float64")
    config = bench_lstm.cell_config(tiny, cell)
    runner = bench_lstm.OrtRunner("ortlstm", config, threads=1, feed="numpy")
    runner.iteration({})  # the timed path runs
    x = runner._feeds["X"]
    _, gradients = _loss_and_gradients(runner, cell, x)
    assert gradients["dW"].shape == (2, CELLS[cell].gates * 5, 4)
    step = 1e-6
    for index in [(0, 0, 0), (1, 1, 2), (2, 0, 3)]:
        plus, minus = x.copy(), x.copy()
        plus[index] += step
        minus[index] -= step
        loss_plus, loss_minus = _loss_and_gradients(runner, cell, plus)[0], _loss_and_gradients(runner, cell, minus)[0]
        numeric = (loss_plus - loss_minus) / (2 * step)
        np.testing.assert_allclose(gradients["dX"][index], numeric, rtol=1e-6, atol=1e-8, err_msg=f"{cell} {index}")


def test_cell_pairs_refuse_what_com_microsoft_lacks() -> None:
    m = bench_lstm.CONFIGS["M"]
    with pytest.raises(bench_lstm.Unavailable, match=r"^com\.microsoft has no RNN training ops$"):
        bench_lstm.OrtRunner("com.microsoft", bench_lstm.cell_config(m, "rnn"), threads=1)
    bidir = bench_lstm.cell_config(bench_lstm.CONFIGS["M-bidir"], "gru")
    with pytest.raises(bench_lstm.Unavailable, match=r"^com\.microsoft GRUTraining supports direction forward only$"):
        bench_lstm.OrtRunner("com.microsoft", bidir, threads=1)


def _timing(ms: float) -> bench_lstm.Timing:
    return bench_lstm.Timing(phases={"fwd": [ms / 2e3], "bwd": [ms / 2e3]}, rounds=1, iterations_per_round=1)


def test_targets_have_rows_per_cell() -> None:
    configs = [bench_lstm.cell_config(bench_lstm.CONFIGS["M"], cell) for cell in ("lstm", "gru", "rnn")]
    timings: dict = {("ortlstm", c.name): _timing(10.0) for c in configs}
    timings |= {("torch", "M"): _timing(20.0), ("torch", "gru-M"): _timing(20.0), ("torch", "rnn-M"): _timing(10.0)}
    timings |= {("com.microsoft", "M"): _timing(300.0), ("com.microsoft", "gru-M"): _timing(40.0)}
    timings[("com.microsoft", "rnn-M")] = "com.microsoft has no RNN training ops"
    limit = {c.name: {"fwd": 4.0, "bwd": 4.0} for c in configs}
    fields = {f.name: None for f in dataclasses.fields(bench_lstm.Results)}
    results = bench_lstm.Results(**{**fields, "configs": configs, "timings": timings, "limit_ms": limit, "memory": {}})
    rows = [line for line in bench_lstm._target_lines(results) if line.startswith("| ") and "---" not in line]
    assert rows[1:] == [
        "| ortlstm/torch <= 0.9 | M | 0.50 | yes |",
        "| ortlstm/limit <= 1.2 | M | 1.25 | **no** |",
        "| com.microsoft/ortlstm >= 20 | M | 30.00 | yes |",
        "| GRU ortlstm/torch <= 0.9 | gru-M | 0.50 | yes |",
        "| RNN ortlstm/torch <= 0.9 | rnn-M | 1.00 | **no** |",
        "| com.microsoft GRUGrad/ortlstm >= 5 | gru-M | 4.00 | **no** |",
    ]


@pytest.mark.parametrize("feed", ["numpy", "iobinding"])
def test_forward_call_runs_the_forward_op_only(feed: str) -> None:
    # onnxruntime 1.32 ignores only_execute_path_to_fetches: the "fwd" phase once timed both ops there.
    runner = bench_lstm.OrtRunner("ortlstm", bench_lstm.cell_config(bench_lstm.CONFIGS["S"], "gru"), 1, feed=feed)
    taken = {value.name for value in runner._forward_session.get_inputs()}
    broken = {name: np.zeros(1, np.float32) for name in taken if name.startswith("stash_")}  # GRUGrad refuses these
    outputs = list(CELLS["gru"].forward_outputs)
    runner._forward_session.run(outputs, {**runner._forward_feeds, **broken}, runner._run_options)


def test_short_names_keep_their_old_options() -> None:
    # bench_gru.py / bench_rnn.py before they became short names for bench_lstm.py --cells.
    old = ["--threads", "1", "--configs", "S", "M", "--rounds", "3"]
    assert short_name_argv(old, "gru") == ["--cells", "gru", "--threads", "1", "--configs", "S,M", "--repeats", "3"]
    old = ["--nonlinearity", "relu", "--configs", "B1"]
    assert short_name_argv(old, "rnn,rnn_relu") == ["--cells", "rnn,rnn_relu", "--cells", "rnn_relu", "--configs", "B1"]
    assert bench_lstm._parse_args(short_name_argv(old, "rnn,rnn_relu")).config_list == [
        bench_lstm.cell_config(bench_lstm.CONFIGS["B1"], "rnn_relu")
    ]


def test_core_round_trip_is_measured_between_two_cpus_and_refused_otherwise() -> None:
    """The probe behind each config's ratios row measures two CPUs and refuses anything else.

    A positive figure between CPUs 0 and 1 of this (at least 2-CPU) machine; -1 from the library
    for one CPU twice or a CPU that does not exist.
    """
    import ctypes
    import os

    import ortlstm.ops

    probe = ctypes.CDLL(ortlstm.ops.library_path()).OrtLstmCoreRoundTripNs
    probe.restype = ctypes.c_double
    probe.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_double]
    assert probe(0, 0, 0.01) == -1.0
    assert probe(0, 4096, 0.01) == -1.0
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("CPUs 0 and 1 are not both this process's")
    # None while another process holds one of the two CPUs (the probe's threads then take turns):
    # a few tries, so a busy moment of a shared machine does not decide.
    for _ in range(10):
        ns = bench_lstm.core_round_trip_ns(0.02)
        if ns is not None:
            break
    assert ns is not None and 1.0 < ns < 1e5


def test_ratios_table_shows_each_configs_round_trip() -> None:
    configs = [bench_lstm.CONFIGS["S"], bench_lstm.CONFIGS["B1"]]
    fields = {f.name: None for f in dataclasses.fields(bench_lstm.Results)}
    trips = {"S": (55.4, 324.0), "B1": (None, 56.0)}
    results = bench_lstm.Results(
        **{
            **fields,
            "configs": configs,
            "timings": {},
            "limit_ms": {c.name: {"fwd": 1.0, "bwd": 1.0} for c in configs},
            "other_load": {},
            "core_round_trip": trips,
        }
    )
    rows = [line for line in bench_lstm._ratio_lines(results) if line.startswith("| S ") or line.startswith("| B1 ")]
    assert rows[0].endswith("| 55 / 324 |") and rows[1].endswith("| n/a / 56 |")


class _ClockRunner(bench_lstm.Runner):
    """A competitor whose calls take ``seconds[state]``, the state being the fake probe's."""

    warm_up_each_round = False

    def __init__(self, name: str, seconds: dict[str, float], state: list[str]) -> None:
        self.name, self._seconds, self._state = name, seconds, state

    def iteration(self, phases: bench_lstm.Phases) -> None:
        for phase in ("fwd", "bwd"):
            phases.setdefault(phase, []).append(self._seconds[self._state[0]])


def test_rounds_are_sorted_by_the_core_state_around_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round is probed before and after; a round across a jump counts in neither state.

    The fake probe reads 60 ns (near) in round 0, 330 ns (far) in round 1 and jumps back during
    ortlstm's round 2: the competitors' near and far medians are their calls' own times in those
    rounds, and the mixed round's calls count in the overall median only.
    """
    monkeypatch.setattr(bench_lstm, "SETTLE_SECONDS", 0.0)
    state = ["near"]
    # Probes in call order: round 0 both competitors, round 1 both (com.microsoft first), then
    # ortlstm's round 2 across the jump back.
    trips = iter([60.0] * 4 + [330.0] * 4 + [330.0, 60.0] + [60.0] * 40)

    def probe() -> float:
        ns = next(trips)
        state[0] = "near" if ns < 100 else "far"
        return ns

    runners = {
        "ortlstm": _ClockRunner("ortlstm", {"near": 0.001, "far": 0.002}, state),
        "com.microsoft": _ClockRunner("com.microsoft", {"near": 0.007, "far": 0.008}, state),
    }
    timings = bench_lstm.time_config(runners, 5, 0.0, 60.0, lambda _: None, round_trip=probe)
    ours, theirs = timings["ortlstm"], timings["com.microsoft"]
    assert [(a, b) for a, b, _ in ours.round_log][:3] == [(60.0, 60.0), (330.0, 330.0), (330.0, 60.0)]
    assert ours.median_ms("fwd", "near") == pytest.approx(1.0) and ours.median_ms("fwd", "far") == pytest.approx(2.0)
    assert theirs.median_ms("bwd", "near") == pytest.approx(7.0)
    assert theirs.median_ms("fwd+bwd", "far") == pytest.approx(16.0)
    assert sum(len(p["fwd"]) for p in ours.states.values()) == ours.rounds - 1  # the mixed round (60 / 330)
    results = bench_lstm.Results(
        **{
            **{f.name: None for f in dataclasses.fields(bench_lstm.Results)},
            "configs": [bench_lstm.CONFIGS["S"]],
            "timings": {(name, "S"): timing for name, timing in timings.items()},
            "limit_ms": {"S": {"fwd": 1.0, "bwd": 1.0}},
            "other_load": {},
            "core_round_trip": {},
        }
    )
    assert results.ratio("com.microsoft", "ortlstm", "S", state="near") == pytest.approx(7.0)
    assert results.ratio("com.microsoft", "ortlstm", "S", state="far") == pytest.approx(4.0)
    row = next(line for line in bench_lstm._ratio_lines(results) if line.startswith("| S "))
    assert "| 7.00 (60 ns) / 4.00 (330 ns) |" in row


def test_rounds_without_a_probe_have_no_state_and_states_are_relative_to_the_whole_run() -> None:
    timing = bench_lstm.Timing()
    timing.round_log = [(None, 60.0, {"fwd": [0.001]}), (80.0, 90.0, {"fwd": [0.003]}), (55.0, 61.0, {"fwd": [0.005]})]
    bench_lstm.tag_core_states([timing])
    assert timing.states == {"near": {"fwd": [0.003, 0.005]}}
    assert timing.state_trips == {"near": [80.0, 90.0, 55.0, 61.0]}
    assert timing.median_ms("fwd", "far") is None
    # Tagged with the rest of the run, a config that ran wholly in the distant state is far.
    distant = bench_lstm.Timing()
    distant.round_log = [(320.0, 330.0, {"fwd": [0.002]}), (318.0, 325.0, {"fwd": [0.004]})]
    bench_lstm.tag_core_states([distant])
    assert set(distant.states) == {"near"}
    bench_lstm.tag_core_states([timing, distant])
    assert distant.states == {"far": {"fwd": [0.002, 0.004]}} and set(timing.states) == {"near"}
    silent = bench_lstm.Timing()
    silent.round_log = [(None, None, {"fwd": [0.001]})]
    bench_lstm.tag_core_states([silent])
    assert silent.states == {}
