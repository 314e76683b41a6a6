"""Stop on a preemption notice (SIGTERM) with a checkpoint of the step just finished.

Schedulers announce an eviction with SIGTERM and a grace period before SIGKILL
(GCE spot and TPU VMs, Kubernetes' `terminationGracePeriodSeconds`, SLURM's
`GraceTime`). Without a handler SIGTERM ends the process at once, and the run
resumes from its last interval checkpoint, losing the steps since. With this
watch the RL loop and SFT finish the step in flight, save it, and stop with
`errors.PreemptedError`; the CLIs print one line and exit with 143 (128 +
SIGTERM, what a shell reports for a process SIGTERM ended).

    preemption = PreemptionWatch(enabled=cfg.checkpoint.every > 0).start()
    try:
        for step in ...:
            ...
            if preemption.reached(done):   # every process, every step
                save(done); raise PreemptedError.at_step(done, ckpt_dir)
    finally:
        preemption.stop()                  # after the last save is written

A Python handler sets a flag that `reached` reads at each step's end. With several
processes (`jax.distributed`) the signal may reach one host only, and every host
must save the same step: `reached` gathers the flag over the processes (one small
host all-gather per step), so all stop at the first step's end at which any has
it. JAX's own preemption service (`multihost_utils.reached_preemption_sync_point`)
is not used: its sync point counts calls from 0 in each process, so a notice
that came before a resumed run's first check set a step the run had passed, and
the run went on to its end. `distributed.initialize` turns that service off, so
a run that checkpoints nothing ends on SIGTERM at once, as with one process.

A notice the loop could not act on (it came during the run's last step, or its
final eval) is not dropped: `stop` restores the previous handler and sends the
signal again, to it, so a caller that goes on to more work (a sweep's next run)
stops too.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import jax
import numpy as np

from gdpo_jax.multihost import allgather

log = logging.getLogger(__name__)

__all__ = ["PreemptionWatch"]


class PreemptionWatch:
    """Installs the notice's handler on `start` (or entering it as a context manager) and
    restores the previous one on `stop`. `enabled=False` (a run that checkpoints
    nothing) changes nothing: SIGTERM ends the process as before.

    The handler is installed only from the main thread (Python allows no other); a
    run started from another thread keeps SIGTERM's previous behaviour."""

    def __init__(self, *, enabled: bool = True):
        self.enabled = enabled
        self.noticed = False
        self.acted = False  # `reached` returned True: the run stopped for the notice
        self._previous: Any = None
        self._installed = False

    def start(self) -> PreemptionWatch:
        """Installs the handler (when enabled); returns self."""
        if not self.enabled:
            return self
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_notice)
            self._installed = True
        return self

    def stop(self) -> None:
        """Restores SIGTERM's previous handler; a notice no step acted on goes on to it."""
        if not self._installed:
            return
        # None: the previous handler was not installed from Python (e.g. by a C library).
        previous = signal.SIG_DFL if self._previous is None else self._previous
        signal.signal(signal.SIGTERM, previous)
        self._installed = False
        if self.noticed and not self.acted:
            os.kill(os.getpid(), signal.SIGTERM)

    def __enter__(self) -> PreemptionWatch:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _on_notice(self, signum: int, frame: Any) -> None:
        # Only a flag: the step in flight finishes, and the loop saves at its end.
        self.noticed = True

    def reached(self, step: int) -> bool:
        """Whether to save `step` (just finished) and stop. With several processes every
        process must call this at every step (a host all-gather)."""
        if not self.enabled:
            return False
        noticed = self.noticed
        if jax.process_count() > 1:  # the notice may have reached another host only
            noticed = bool(allgather(np.asarray(noticed, np.int32)).max())
        if noticed:
            log.warning("preemption notice (SIGTERM): saving step %d and stopping", step)
            self.acted = True
        return noticed
