"""The preemption watch: SIGTERM noticed at a step boundary, one process or several
(JAX's preemption sync point), and SIGTERM's previous handler restored.

The RL loop's and SFT's save-and-stop are tested in test_train_loop / test_sft, the
CLIs' exit status in test_train_cli."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from gdpo_jax.train.preemption import PreemptionWatch
from tests.test_multihost import _free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def quiet_sigterm():
    """A harmless SIGTERM handler for the test (the default one ends pytest)."""
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    yield calls
    signal.signal(signal.SIGTERM, previous)


def test_a_sigterm_is_noticed_at_the_next_check_and_the_old_handler_comes_back(quiet_sigterm):
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionWatch() as watch:
        assert signal.getsignal(signal.SIGTERM) is not before
        assert not watch.reached(1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert watch.reached(2) and watch.reached(3)  # it stays noticed
    assert signal.getsignal(signal.SIGTERM) is before
    assert quiet_sigterm == []  # the watch took the signal, not the handler before it
    os.kill(os.getpid(), signal.SIGTERM)
    assert quiet_sigterm == [signal.SIGTERM]


def test_a_disabled_watch_leaves_sigterm_alone(quiet_sigterm):
    before = signal.getsignal(signal.SIGTERM)
    watch = PreemptionWatch(enabled=False).start()
    assert signal.getsignal(signal.SIGTERM) is before
    os.kill(os.getpid(), signal.SIGTERM)
    assert not watch.reached(1) and quiet_sigterm == [signal.SIGTERM]
    watch.stop()


def test_off_the_main_thread_the_watch_installs_nothing(quiet_sigterm):
    # signal.signal raises there; a run started from a worker thread keeps SIGTERM as is.
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def run():
        with PreemptionWatch() as watch:
            seen.append((signal.getsignal(signal.SIGTERM) is before, watch.reached(1)))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [(True, False)]


_WORKER = """
import os, sys, time
import jax
from gdpo_jax.train.preemption import PreemptionWatch
pid, port = int(sys.argv[1]), sys.argv[2]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
with PreemptionWatch() as watch:
    print("ready", flush=True)
    for step in range(1, 2000):
        time.sleep(0.02)
        if watch.reached(step):
            print("reached", step, flush=True)
            break
"""


def test_two_processes_stop_at_the_same_step_when_one_gets_the_notice(tmp_path):
    # With several processes the notice reaches one host; each must save the same step,
    # or the checkpoint would be torn. JAX's sync point picks one past every host's step.
    port = str(_free_port())
    drop = ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR", "JAX_COMPILATION_CACHE_MAX_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    logs = [tmp_path / f"p{i}.log" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(i), port],
            stdout=open(logs[i], "w"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        for i in range(2)
    ]
    try:
        deadline = time.time() + 90
        while not all("ready" in path.read_text() for path in logs):
            assert all(p.poll() is None for p in procs), [p.read_text() for p in logs]
            assert time.time() < deadline, [p.read_text() for p in logs]
            time.sleep(0.1)
        procs[1].send_signal(signal.SIGTERM)  # one host only
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    reached = []
    for path in logs:
        lines = [line.split() for line in path.read_text().splitlines()]
        reached += [int(w[1]) for w in lines if w[:1] == ["reached"]]
    assert [p.returncode for p in procs] == [0, 0], [p.read_text() for p in logs]
    assert len(reached) == 2 and reached[0] == reached[1] < 1999, reached
