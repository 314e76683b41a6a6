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

One process: a Python handler sets a flag that `reached` reads at the step's end.
Several processes (`jax.distributed` initialized): the signal may reach any one
host, and each must save the same step, so `reached` is JAX's preemption sync
point (`multihost_utils.reached_preemption_sync_point`, the coordination
service's own SIGTERM notifier): the hosts agree on one step past the notice and
all return True there. Either way the notice counts only at a step boundary,
so the saved state is a whole step's.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["PreemptionWatch", "distributed_client_running"]


def distributed_client_running() -> bool:
    """Whether `jax.distributed.initialize` ran in this process (its preemption
    service then owns SIGTERM)."""
    import jax

    return jax.distributed.is_initialized()


class PreemptionWatch:
    """Installs the notice's handler on `start` (or entering it as a context manager) and
    restores the previous one on `stop`. `enabled=False` (a run that checkpoints
    nothing) changes nothing: SIGTERM ends the process as before.

    The handler is installed only from the main thread (Python allows no other); a
    run started from another thread keeps SIGTERM's previous behaviour."""

    def __init__(self, *, enabled: bool = True):
        self.enabled = enabled
        self.noticed = False
        self._synced = False
        self._previous: Any = None
        self._installed = False

    def start(self) -> PreemptionWatch:
        """Installs the handler (when enabled); returns self."""
        if not self.enabled:
            return self
        if distributed_client_running():
            self._synced = True  # JAX's preemption service catches the signal
        elif threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_notice)
            self._installed = True
        return self

    def stop(self) -> None:
        """Restores SIGTERM's previous handler."""
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def __enter__(self) -> PreemptionWatch:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _on_notice(self, signum: int, frame: Any) -> None:
        # Only a flag: the step in flight finishes, and the loop saves at its end.
        self.noticed = True

    def reached(self, step: int) -> bool:
        """Whether to save `step` (just finished) and stop. With several processes every
        process must call this at every step, with the same step numbers."""
        if not self.enabled:
            return False
        if self._synced:
            from jax.experimental import multihost_utils

            try:
                self.noticed = multihost_utils.reached_preemption_sync_point(step)
            except RuntimeError:  # the service is off (jax_enable_preemption_service)
                return False
        if self.noticed:
            log.warning("preemption notice (SIGTERM): saving step %d and stopping", step)
        return self.noticed
