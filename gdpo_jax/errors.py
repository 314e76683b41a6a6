"""Errors shared across layers (a leaf module: imports nothing from gdpo_jax)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config field is invalid; the message names the field and the fix."""


class NonFiniteUpdateError(RuntimeError):
    """A training step's gradient or update was not finite; it was not applied and the
    run stopped before checkpointing that step (its last checkpoint is intact)."""

    @classmethod
    def at_step(cls, step: int, metrics: dict, last: int | None) -> NonFiniteUpdateError:
        """The error for `step`, whose metrics count `nonfinite_updates`; `last`: the
        latest checkpointed step (None: none)."""
        nan = float("nan")
        return cls(
            f"step {step}: {int(metrics['nonfinite_updates'])} update(s) had a non-finite "
            f"gradient or update (loss={metrics.get('loss', nan):.4g}, grad_norm="
            f"{metrics.get('grad_norm', nan):.4g}); they were not applied and the run stops "
            f"before checkpointing step {step} (a resume starts from step {last or 0}). "
            "Lower --config.optim.lr or raise --config.optim.warmup_steps; with "
            "model.dtype=float16, use bfloat16 (float16 activations overflow)."
        )


class PreemptedError(RuntimeError):
    """The run got a preemption notice (SIGTERM), saved the step it had just finished
    and stopped (`gdpo_jax/train/preemption.py`); the same command resumes it."""

    @classmethod
    def at_step(cls, step: int, checkpoints: str) -> PreemptedError:
        """The error for a run stopped after `step`, saved in `checkpoints`."""
        return cls(
            f"preemption notice (SIGTERM): stopped after step {step} and saved it in "
            f"{checkpoints}; run the same command to resume from step {step}."
        )


class RanAlreadyError(RuntimeError):
    """`run()` was called again on a Trainer or SFT that ran: each runs once."""

    @classmethod
    def of(cls, kind: str) -> RanAlreadyError:
        """The error for a second `run()` of a `kind` ("Trainer", "SFT")."""
        return cls(
            f"this {kind} has run already: its checkpointer and reward pool are closed, and "
            "a second run() would log over the run's metrics from the step it started at. "
            f"Build a new {kind}(cfg) to continue from the run's last checkpoint."
        )
