"""The `length` reward of the math and code tasks (paper eq. 8: conditioned on correctness).

Registered under "length" on import; gdpo_jax.rewards imports this module on the
first lookup of a reward it does not know (see rewards.registry._BUILTIN_MODULES),
so `RewardSpec("length")` works without importing the task.
"""

from __future__ import annotations

from collections.abc import Sequence

from gdpo_jax.rewards.registry import completion_token_counts, register_reward


@register_reward("length")
def length_reward(
    prompts: Sequence,
    completions: Sequence[str],
    *,
    max_tokens: int = 4000,
    completion_lengths: Sequence[int] | None = None,
    **kwargs,
) -> list[float]:
    """1.0 when the completion has at most `max_tokens` tokens, else 0.0.

    Token counts come from the `completion_lengths` field (the sampler's
    Rollouts.lengths, passed as an extra field to the runner) or, missing
    that, from `estimate_tokens`. Condition it on correctness with
    RewardSpec("length", condition="math_correct") (paper eq. 8).
    """
    if max_tokens <= 0:
        raise ValueError(f"length reward: max_tokens must be > 0, got {max_tokens}")
    counts = completion_token_counts(completions, completion_lengths)
    return [1.0 if n <= max_tokens else 0.0 for n in counts]
