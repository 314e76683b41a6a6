"""Reward functions, their registry, the batch runner and the code sandbox.

    from gdpo_jax.rewards import RewardRunner, RewardSpec
    runner = RewardRunner([RewardSpec("math_correct"),
                           RewardSpec("length", condition="math_correct",
                                      kwargs={"max_tokens": 4000})])
    rewards, info = runner(prompts, completions, examples,
                           completion_lengths=rollouts.lengths)   # f32[N, 2]

The built-in task rewards (gdpo_jax.tasks.*, the `length` reward included) register
on the first lookup.
"""

from gdpo_jax.rewards.registry import MOVED as _MOVED
from gdpo_jax.rewards.registry import (
    RewardTimeouts,
    completion_token_counts,
    estimate_tokens,
    get_reward,
    list_rewards,
    register_reward,
)
from gdpo_jax.rewards.registry import moved as _moved
from gdpo_jax.rewards.runner import RewardError, RewardRunner, RewardSpec, gate

__all__ = [
    "RewardError",
    "RewardRunner",
    "RewardSpec",
    "RewardTimeouts",
    "completion_token_counts",
    "estimate_tokens",
    "gate",
    "get_reward",
    "list_rewards",
    "register_reward",
]


def __getattr__(name: str):
    # Moved names (e.g. length_reward -> gdpo_jax.tasks.length): an error naming the new path.
    if name in _MOVED:
        raise _moved(__name__, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
