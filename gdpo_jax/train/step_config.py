"""The step's static settings: `StepConfig` (hashable, bound into the jitted step
with functools.partial), its builder from the run config (`StepConfig.from_config`),
the batch keys the step reads, the rules for taking the old log-probs from the
step's own forward (`old_logp_in_step`) and the reference log-probs from a
forward inside the step (`ref_logp_in_step`), and when each prompt can run once per
micro-batch (`share_prompt_blocker`, `check_group_prompts`).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

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
    nan_rewards: str = "omit"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    beta: float = 0.0
    kl_estimator: str = "k3"
    kl_in_reward: float = 0.0
    kl_in_reward_estimator: str = "k1"
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
    # True: each micro-batch runs the reference policy's forward inside the step
    # (passed as step(state, batch, ref_params)), no separate log-prob program and
    # no "ref_logp" batch key (see ref_logp_in_step).
    ref_logp_in_step: bool = False
    # True: each micro-batch runs each distinct prompt once (models.prompt_sharing).
    # Needs micro-batches of whole groups (`layout_units`): rows grouped by
    # prompt, group_size rows each.
    # group_size and batch_shards (the mesh's batch shard count) decide the
    # layout's units (`layout_units`), with or without share_prompt.
    share_prompt: bool = False
    group_size: int = 0
    batch_shards: int = 1

    @property
    def needs_ref(self) -> bool:
        return self.beta > 0 or self.kl_in_reward > 0

    @property
    def shared_group(self) -> int:
        """Rows per shared prompt in `completion_logprobs` (0: every row runs its own)."""
        return self.group_size if self.share_prompt else 0

    def layout_units(self, rows: int) -> tuple[int, int]:
        """Rows per unit of the step's mini- and micro-batch split (`blocks.to_blocks`):
        `group_size` (whole prompt groups) where each of the `batch_shards`
        shards holds whole groups of every mini- (micro-) batch, else 1 (rows).
        Raises if `share_prompt` is set and a micro-batch would split a group."""
        G, S = self.group_size, self.batch_shards
        U, M = self.num_minibatches, self.num_microbatches
        grouped = G > 0 and rows == self.num_groups * G
        mini = G if grouped and self.num_groups % (S * U) == 0 else 1
        why = share_prompt_blocker(self.num_groups, U * M, S)  # the micro-batch rule
        micro = G if mini > 1 and not why else 1
        if self.share_prompt and micro == 1:
            raise ValueError(
                f"StepConfig(share_prompt=True): {rows} rows, {self.num_groups} groups of "
                f"{G}: {why or 'rows != groups x group_size'}; "
                "set config.algo.share_prompt=False."
            )
        return mini, micro

    @property
    def updates_per_step(self) -> int:
        return self.num_epochs * self.num_minibatches

    @classmethod
    def from_config(cls, cfg, batch_shards: int = 1) -> StepConfig:
        """The step's settings from a run config; `batch_shards`: the mesh's batch
        shard count (``sharding.batch_axis_size``), which decides whether
        `algo.share_prompt` can apply (`share_prompt_blocker`)."""
        a = cfg.algo
        blocks = a.num_minibatches * a.num_microbatches
        share = bool(a.get("share_prompt", False)) and not share_prompt_blocker(
            a.num_prompts, blocks, batch_shards
        )
        return cls(
            num_groups=a.num_prompts,
            estimator=a.estimator,
            weights=tuple(float(w) for w in cfg.rewards.weights) or None,
            eps=a.eps,
            batch_norm=a.batch_norm,
            nan_rewards=a.nan_rewards,
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip=a.dual_clip or None,
            beta=a.beta,
            kl_estimator=a.kl_estimator,
            kl_in_reward=a.kl_in_reward,
            kl_in_reward_estimator=a.get("kl_in_reward_estimator", "k1"),
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
            ref_logp_in_step=ref_logp_in_step(
                a.beta,
                updates_per_step=a.num_epochs * a.num_minibatches,
                kl_in_reward=a.kl_in_reward,
            ),
            share_prompt=share,
            group_size=a.group_size,
            batch_shards=batch_shards,
        )


def share_prompt_blocker(num_prompts: int, blocks: int, batch_shards: int) -> str:
    """Why each prompt cannot run once per micro-batch ("" if it can).

    Every device's share of every micro-batch must be whole groups: the
    `num_prompts` groups split evenly over `batch_shards` x `blocks`
    (num_minibatches x num_microbatches) pieces.
    """
    if num_prompts % (batch_shards * blocks):
        return (
            f"algo.num_prompts={num_prompts} is not a multiple of {batch_shards} batch "
            f"shard(s) x {blocks} (num_minibatches x num_microbatches), so a device's "
            "micro-batch would split a group"
        )
    return ""


def check_group_prompts(prompt_ids: np.ndarray, prompt_mask: np.ndarray, group_size: int) -> None:
    """Raises unless the rows (host arrays [N, P]) are prompt-major groups of
    `group_size` rows with one prompt each: what `share_prompt` assumes."""
    for name, x in (("prompt_ids", prompt_ids), ("prompt_mask", prompt_mask)):
        x = np.asarray(x)
        if x.shape[0] % group_size:
            raise ValueError(f"{name}: {x.shape[0]} rows are not groups of {group_size}.")
        g = x.reshape(x.shape[0] // group_size, group_size, -1)
        bad = np.flatnonzero(np.any(g != g[:, :1], axis=(1, 2)))
        if bad.size:
            raise ValueError(
                f"{name}: group {int(bad[0])} (rows {int(bad[0]) * group_size}.."
                f"{(int(bad[0]) + 1) * group_size - 1}) holds different prompts, but "
                "algo.share_prompt runs one prompt per group; set config.algo.share_prompt=False."
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


def ref_logp_in_step(beta: float, *, updates_per_step: int, kl_in_reward: float) -> bool:
    """Whether the reference log-probs can be computed inside the step.

    With one optimizer update per rollout batch each micro-batch needs the
    reference log-probs exactly once, so running the reference forward in the
    step's micro-batch loop does the same FLOPs as a separate pass, without a
    second program and its [N, C] output. Not with several updates (each would
    redo the reference forward), and not with kl_in_reward > 0 (its penalty
    enters the advantages, before the micro-batch loop).
    """
    return beta > 0 and updates_per_step == 1 and kl_in_reward == 0
