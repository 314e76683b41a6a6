"""math-verify with a hard deadline per comparison: it runs in a helper process.

math-verify's own timeouts use SIGALRM: off in worker threads, and even in a
main thread a signal only lands between bytecodes, so one long C call (sympy
evaluating `9^{9^{9^{9}}}`, a bigint power) holds the GIL and hangs the whole
trainer. Here each thread (each reward worker, or each process-pool worker)
owns a helper process that does the parse + verify; the caller waits on a
pipe (GIL released) and, past the deadline, kills the helper and raises
TimeoutError. The next comparison starts a fresh helper.

Protocol (JSON lines): helper prints "ready" once math-verify is imported;
then per request [pred, gold] it answers 1 (equivalent) or 0.
"""

from __future__ import annotations

import functools
import json
import os
import select
import subprocess
import sys
import threading
import time

# Start-up (importing sympy / antlr) is not part of a comparison's deadline.
STARTUP_TIMEOUT_S = 120.0
_PR_SET_PDEATHSIG = 1
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# The helper's command (a test starts a slower one).
_COMMAND = (sys.executable, "-m", "gdpo_jax.tasks.math_verifier")


class _Helper:
    """One helper process, used by one thread at a time. Started here, ready (math-verify
    imported) once `wait_ready` has read its "ready"."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([_ROOT, *filter(None, [env.get("PYTHONPATH")])])
        self.proc = subprocess.Popen(
            list(_COMMAND),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
            bufsize=1,
        )
        self.started, self.ready = time.monotonic(), False

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the helper is ready within `timeout_s`; RuntimeError when it died or
        has not started within STARTUP_TIMEOUT_S of its launch."""
        if self.ready:
            return True
        limit = self.started + STARTUP_TIMEOUT_S - time.monotonic()
        line = self._readline(max(0.0, min(timeout_s, limit)))
        if line == "ready":
            self.ready = True
            return True
        if line is not None or self.proc.poll() is not None or timeout_s >= limit:
            self.kill()
            raise RuntimeError(
                f"the math-verify helper process did not start within {STARTUP_TIMEOUT_S}s"
            )
        return False

    def _readline(self, timeout_s: float) -> str | None:
        """The next line of the helper's output; None past the deadline or at EOF."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            line = self.proc.stdout.readline()  # one whole line follows a readable fd
            return line.strip() if line else None

    def check(self, pred: str, gold: str, timeout_s: float) -> bool:
        try:
            self.proc.stdin.write(json.dumps([pred, gold]) + "\n")
            self.proc.stdin.flush()
        except OSError:
            self.kill()
            raise TimeoutError("the math-verify helper process died") from None
        answer = self._readline(timeout_s)
        if answer not in ("0", "1"):
            self.kill()
            raise TimeoutError(f"math-verify took more than {timeout_s}s")
        return answer == "1"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


_LOCAL = threading.local()


def verify_bounded(pred: str, gold: str, timeout_s: float, deadline: float | None = None) -> bool:
    """math-verify equivalence of two answer strings; TimeoutError past `timeout_s`.

    deadline: a time.monotonic() time (the reward call's) that nothing here runs past,
    the helper's start-up included: a helper restarted after each timeout (1.5-2.5 s of
    imports, outside every budget) put a chunk of slow answers past the runner's timeout,
    which then scored every sample of it NaN, right ones too. Without a deadline the
    start-up is not part of `timeout_s` (STARTUP_TIMEOUT_S bounds it).
    """
    helper = getattr(_LOCAL, "helper", None)
    if helper is None or helper.proc.poll() is not None:
        helper = _LOCAL.helper = _Helper()
    wait = STARTUP_TIMEOUT_S if deadline is None else deadline - time.monotonic()
    if not helper.wait_ready(wait):  # still starting: kept for the next comparison
        raise TimeoutError("the math-verify helper was still starting at the deadline")
    if deadline is not None:
        timeout_s = min(timeout_s, deadline - time.monotonic())
        if timeout_s <= 0:
            raise TimeoutError("no time left for math-verify before the deadline")
    try:
        return helper.check(pred, gold, timeout_s)
    except TimeoutError:
        # The replacement starts now, its imports overlapping the caller's other work.
        _LOCAL.helper = _Helper()
        raise


@functools.cache
def _math_verify():
    import math_verify  # lazy: the sympy / antlr import takes ~0.5 s
    import math_verify.grader
    import math_verify.parser

    # It warns (racily, once per thread) when timeouts are off; that is
    # deliberate (math_verifier's deadline is the bound), so mark it as shown.
    math_verify.parser.TIMEOUT_WARNING_SHOWN = math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    return math_verify.parse, math_verify.verify


def verify_unbounded(pred: str, gold: str) -> bool:
    """parse + verify in this process, no timeouts (the helper's work)."""
    parse, verify = _math_verify()
    g = parse(f"${gold}$", parsing_timeout=None)
    p = parse(f"${pred}$", parsing_timeout=None)
    if not (g and p):
        return False
    try:
        return bool(verify(g, p, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - sympy edge cases: not equivalent
        return False


def _serve() -> None:
    try:  # die with the thread that started us (Linux): no orphaned sympy loops
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    verify_unbounded("1", "1")  # import and warm up before "ready"
    print("ready", flush=True)
    for line in sys.stdin:
        pred, gold = json.loads(line)
        print(int(verify_unbounded(pred, gold)), flush=True)


if __name__ == "__main__":
    _serve()
