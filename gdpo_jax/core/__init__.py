"""Pure-jnp maths of GDPO / GRPO: advantages, log-probs, losses.

Everything here is a function of arrays (no config objects), jit-able, and
works with rows sharded over a mesh with Auto or Explicit axes.
"""

from gdpo_jax.core.advantages import (
    BATCH_NORMS,
    ESTIMATORS,
    NAN_REWARDS,
    compute_advantages,
    gate_reward,
    group_distinct_advantages,
    per_reward_group_spread,
)
from gdpo_jax.core.logprobs import (
    chunked_token_logprobs,
    token_entropy,
    token_logprobs,
    unembed_logits,
)
from gdpo_jax.core.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    aggregate,
    kl_penalty,
    policy_loss,
    safe_div,
    sequence_kl,
)

__all__ = [
    "AGGREGATIONS",
    "BATCH_NORMS",
    "ESTIMATORS",
    "KL_ESTIMATORS",
    "NAN_REWARDS",
    "aggregate",
    "chunked_token_logprobs",
    "compute_advantages",
    "gate_reward",
    "group_distinct_advantages",
    "kl_penalty",
    "per_reward_group_spread",
    "policy_loss",
    "safe_div",
    "sequence_kl",
    "token_entropy",
    "token_logprobs",
    "unembed_logits",
]
