"""The library in a long-lived process: threads that outlive sessions, sessions made and released in a loop.

onnxruntime unloads a custom-op library when the last session that registered it goes away. The
statically linked oneMKL leaves thread-specific data with destructors inside the library, so a
thread that ran a kernel and exited after that crashed the process (SIGSEGV in
``__nptl_deallocate_tsd``), and every reload leaked a copy of its state (issue 11). The library is
now linked with ``-z nodelete`` (CMakeLists.txt) and stays mapped once loaded.

Every scenario runs in a child process, where a crash is a negative return code (a signal) and
fails the test, with cwd outside the checkout so that the child imports the installed package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

# scripts/test.sh sets this for the AddressSanitizer run, whose quarantine and shadow memory make
# RSS grow with every allocation, leak or not.
UNDER_SANITIZER = os.environ.get("ORTLSTM_UNDER_SANITIZER") == "1"

# Times each thread scenario is repeated in one child: the crash after join() was intermittent
# (about 1 run in 100 before the fix); the one without join() was certain.
THREAD_ROUNDS = 100
CHURN_WARM_UP = 50
CHURN_CYCLES = 500
CHURN_RSS_LIMIT_MIB = 5.0

# Helpers of every child: one tiny LSTMTraining session (T=2, N=2, I=2, H=3) and the library's
# presence in the process's memory map.
_PRELUDE = textwrap.dedent(
    """
    import gc, json, sys, threading, weakref
    import numpy as np
    sys.path.insert(0, {tests!r})
    import onnxruntime as ort
    import op_runner
    import ortlstm.ops
    from ortlstm.ops import library

    MODEL = op_runner.make_model("LSTMTraining", ["X", "W", "R"], ["HAll", "Ht"], np.float32, {{"hidden_size": 3}})
    MODEL_BYTES = MODEL.SerializeToString()
    FEEDS = {{
        "X": np.ones((2, 2, 2), np.float32),
        "W": np.full((1, 12, 2), 0.1, np.float32),
        "R": np.full((1, 12, 3), 0.1, np.float32),
    }}

    def new_session():
        return ort.InferenceSession(MODEL_BYTES, ortlstm.ops.session_options(), providers=["CPUExecutionProvider"])

    def check_released(session_ref):
        # Freed by reference count, at once: gc.collect() per cycle would cost 0.7 s with torch imported.
        assert session_ref() is None, "the session outlived its last reference"

    def library_mapped():
        with open("/proc/self/maps") as maps:
            return any(library.LIBRARY_FILENAME in line for line in maps)
    """
)

_THREAD_SCRIPT = _PRELUDE + textwrap.dedent(
    """
    join_first = sys.argv[1] == "join_before_release"
    mapped_after_release = []
    for _ in range({rounds}):
        session = new_session()
        ran, finish = threading.Event(), threading.Event()

        def work():
            session.run(None, FEEDS)  # the thread keeps no reference to the session afterwards
            ran.set()
            if not join_first:
                finish.wait()  # alive until the last session is gone

        thread = threading.Thread(target=work)
        thread.start()
        ran.wait()
        if join_first:
            thread.join()
        session_ref = weakref.ref(session)
        del session
        check_released(session_ref)
        mapped_after_release.append(library_mapped())
        finish.set()
        thread.join()  # the thread exits here: its thread-specific destructors run
    print(json.dumps({{"rounds": {rounds}, "mapped_after_release": all(mapped_after_release)}}), flush=True)
    """
)

_CHURN_SCRIPT = _PRELUDE + textwrap.dedent(
    """
    def rss_kib():
        gc.collect()
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))

    def cycle():
        session = new_session()
        session.run(None, FEEDS)
        session_ref = weakref.ref(session)
        del session
        check_released(session_ref)

    for _ in range({warm_up}):  # onnxruntime's and oneMKL's one-time state
        cycle()
    before = rss_kib()
    for _ in range({cycles}):
        cycle()
    print(json.dumps({{"growth_kib": rss_kib() - before, "mapped": library_mapped()}}), flush=True)
    """
)


def _run_child(script: str, *args: str, timeout: float) -> dict:
    """Runs ``script`` in a fresh interpreter; fails on a signal, an error or a timeout."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            # From the checkout's root, `import ortlstm` would find the source folder, not the install.
            cwd=tempfile.gettempdir(),
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"child did not finish in {timeout} s; stdout: {error.stdout!r}")
    if result.returncode < 0:
        pytest.fail(f"child killed by signal {-result.returncode}; stderr: {result.stderr[-3000:]}")
    assert result.returncode == 0, f"child failed (rc={result.returncode}): {result.stderr[-3000:]}"
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"child printed no result: {result.stdout[-3000:]}"
    return json.loads(lines[-1])


def _script(template: str, **values: object) -> str:
    return template.format(tests=str(Path(__file__).parent), **values)


@pytest.fixture(scope="module", params=["alive_at_release", "join_before_release"])
def thread_outcome(request: pytest.FixtureRequest) -> dict:
    """A thread runs a session, the last session is released, the thread exits; THREAD_ROUNDS times."""
    return _run_child(_script(_THREAD_SCRIPT, rounds=THREAD_ROUNDS), request.param, timeout=300)


def test_thread_outliving_the_last_session_exits_cleanly(thread_outcome: dict) -> None:
    assert thread_outcome["rounds"] == THREAD_ROUNDS


def test_library_stays_mapped_after_the_last_session(thread_outcome: dict) -> None:
    """The mechanism of the fix: nothing of the library can be unmapped while its code may still run."""
    assert thread_outcome["mapped_after_release"]


@pytest.fixture(scope="module")
def churn_outcome() -> dict:
    """CHURN_CYCLES sessions created, run and released in one child, after CHURN_WARM_UP more."""
    return _run_child(_script(_CHURN_SCRIPT, warm_up=CHURN_WARM_UP, cycles=CHURN_CYCLES), timeout=300)


def test_session_churn_keeps_the_library_loaded(churn_outcome: dict) -> None:
    assert churn_outcome["mapped"]


def test_session_churn_rss_is_bounded(churn_outcome: dict) -> None:
    """Each released session left 80-210 KiB behind before the fix: about 40 MiB per 500 cycles."""
    if UNDER_SANITIZER:
        pytest.skip("RSS is not a leak measure under AddressSanitizer (quarantine, shadow memory)")
    growth_mib = churn_outcome["growth_kib"] / 1024
    assert growth_mib < CHURN_RSS_LIMIT_MIB, f"RSS grew by {growth_mib:.2f} MiB over {CHURN_CYCLES} cycles"
