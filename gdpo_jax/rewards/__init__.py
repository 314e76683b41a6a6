"""Reward functions, their registry, the batch runner and the code sandbox.

    from gdpo_jax.rewards import RewardRunner, RewardSpec
    runner = RewardRunner([RewardSpec("math_correct"),
                           RewardSpec("length", condition="math_correct",
                                      kwargs={"max_tokens": 4000})])
    rewards, info = runner(prompts, completions, examples,
                           completion_lengths=rollouts.lengths)   # f32[N, 2]

The built-in task rewards (gdpo_jax.tasks.*) register on the first lookup.
"""

from gdpo_jax.rewards.registry import (
    RewardTimeouts,
    completion_token_counts,
    estimate_tokens,
    get_reward,
    length_reward,
    list_rewards,
    register_reward,
)
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
    "length_reward",
    "list_rewards",
    "register_reward",
]
