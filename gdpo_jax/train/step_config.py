"""The step's static settings: `StepConfig` (hashable, bound into the jitted step
with functools.partial), its builder from the run config (`StepConfig.from_config`),
the batch keys the step reads, and the rule for taking the old log-probs from the
step's own forward (`old_logp_in_step`).
"""

from __future__ import annotations

import dataclasses

import jax

Batch = dict[str, jax.Array]
BATCH_KEYS = (
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "old_logp",
    "rewards",
    "group_ids",
    "valid",
)


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Static (hashable) settings of the step; bound with functools.partial."""

    num_groups: int
    estimator: str = "gdpo"
    weights: tuple[float, ...] | None = None
    eps: float = 1e-4
    batch_norm: str = "sample"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    beta: float = 0.0
    kl_estimator: str = "k3"
    kl_in_reward: float = 0.0
    entropy_coef: float = 0.0
    aggregation: str = "grpo"
    max_len: int | None = None
    num_minibatches: int = 1
    num_microbatches: int = 1
    num_epochs: int = 1
    temperature: float = 1.0
    logprob_chunk_size: int = 0
    # Names for the per-reward metrics (adv/share/<name>); None: the column index.
    reward_names: tuple[str, ...] | None = None
    # True: the old log-probs are stop_gradient(the step's own log-probs), no
    # separate forward pass and no "old_logp" batch key (see old_logp_in_step).
    old_logp_in_step: bool = False

    @property
    def needs_ref(self) -> bool:
        return self.beta > 0 or self.kl_in_reward > 0

    @property
    def updates_per_step(self) -> int:
        return self.num_epochs * self.num_minibatches

    @classmethod
    def from_config(cls, cfg) -> StepConfig:
        a = cfg.algo
        return cls(
            num_groups=a.num_prompts,
            estimator=a.estimator,
            weights=tuple(float(w) for w in cfg.rewards.weights) or None,
            eps=a.eps,
            batch_norm=a.batch_norm,
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip=a.dual_clip or None,
            beta=a.beta,
            kl_estimator=a.kl_estimator,
            kl_in_reward=a.kl_in_reward,
            entropy_coef=a.entropy_coef,
            aggregation=a.aggregation,
            max_len=a.max_len or cfg.sampling.max_new_tokens,
            num_minibatches=a.num_minibatches,
            num_microbatches=a.num_microbatches,
            num_epochs=a.num_epochs,
            temperature=cfg.sampling.temperature,
            logprob_chunk_size=a.logprob_chunk_size,
            reward_names=tuple(str(n) for n in cfg.rewards.names) or None,
            old_logp_in_step=old_logp_in_step(
                a.old_logprobs,
                updates_per_step=a.num_epochs * a.num_minibatches,
                kl_in_reward=a.kl_in_reward,
            ),
        )


def old_logp_in_step(old_logprobs: str, *, updates_per_step: int, kl_in_reward: float) -> bool:
    """Whether recomputed old log-probs can come from the step's own forward pass.

    With one optimizer update per rollout batch every micro-batch sees the
    parameters that sampled-then-recompute would read, so the old log-probs
    equal stop_gradient(logp) of the loss's forward (TRL does the same): the
    separate pre-update forward pass is pure waste. Not with several updates
    (later updates need the pre-update values), and not with kl_in_reward > 0
    (its penalty enters the advantages, before any gradient is taken).
    """
    return old_logprobs == "recompute" and updates_per_step == 1 and kl_in_reward == 0


# --------------------------------------------------------------------------- #
# Log-probs of the completion tokens.
