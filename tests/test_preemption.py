"""The preemption watch: SIGTERM noticed at a step boundary, one process or several
(every process stops at the same step), SIGTERM's previous handler restored, and a
notice no step acted on handed on to it.

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


def test_a_notice_no_step_acted_on_goes_on_to_the_previous_handler(quiet_sigterm):
    # A SIGTERM during a run's last step (no step boundary left to act on it) was
    # dropped: a sweep's next run started and was SIGKILLed after the grace period.
    with PreemptionWatch():
        os.kill(os.getpid(), signal.SIGTERM)
    assert quiet_sigterm == [signal.SIGTERM]
    with PreemptionWatch() as watch:  # acted on (the run saved and stopped): kept
        os.kill(os.getpid(), signal.SIGTERM)
        assert watch.reached(4)
    assert quiet_sigterm == [signal.SIGTERM]


_WORKER = """
import sys, time
from gdpo_jax.train import distributed
from gdpo_jax.train.preemption import PreemptionWatch
pid, port, first, delay = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
distributed.initialize("always", coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                       process_id=pid)
with PreemptionWatch() as watch:
    print("ready", flush=True)
    time.sleep(delay)  # a resumed run's restore and first step: the notice may come first
    for step in range(first, first + 2000):
        time.sleep(0.02)
        if watch.reached(step):
            print("reached", step, flush=True)
            break
"""


@pytest.mark.parametrize(
    "first, delay", [(1, 0.0), (6, 3.0)], ids=["during_the_steps", "before_a_resumed_first_step"]
)
def test_two_processes_stop_at_the_same_step_when_one_gets_the_notice(tmp_path, first, delay):
    # With several processes the notice reaches one host; each must save the same step,
    # or the checkpoint would be torn. JAX's own sync point (used first) counts calls from
    # 0 in each process: a notice before a resumed run's first check (first step 6) set
    # sync point 1, never reached, and both processes ran to the end.
    port = str(_free_port())
    drop = ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR", "JAX_COMPILATION_CACHE_MAX_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    logs = [tmp_path / f"p{i}.log" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(i), port, str(first), str(delay)],
            stdout=open(logs[i], "w"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        for i in range(2)
    ]
    try:
        deadline = time.time() + 90
        while not all("ready" in path.read_text() for path in logs):
            assert all(p.poll() is None for p in procs), [path.read_text() for path in logs]
            assert time.time() < deadline, [path.read_text() for path in logs]
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
    assert [p.returncode for p in procs] == [0, 0], [path.read_text() for path in logs]
    assert len(reached) == 2 and reached[0] == reached[1] < first + 1999, reached
    if delay:
        assert reached == [first, first]  # the first check after the notice
