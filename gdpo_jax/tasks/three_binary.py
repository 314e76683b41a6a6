"""Three independent binary rewards with different base rates (GDPO's "rare reward" regime).

The word-level toy requests of ``gdpo_jax.tasks.toy`` ("weather paris
oslo"), learned by RL from a random-init policy, scored by three {0, 1}
rewards that a random policy hits at clearly different rates:

  three_correct  the first word is the requested tool   (rarest: ~1/40 at init);
  three_short    at most ``max_words`` words (stopped early);
  three_marker   the required marker word ``marker`` ("please") appears.

They can all be satisfied at once ("weather please"), and none implies
another. With G = 8, a group rarely holds a correct rollout at the start:
GDPO normalises each reward within its group, so that one success gets a
large advantage, while GRPO on the sum weighs it like one more marker hit.
The study (configs/study_three_binary.py) measures whether that matters.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gdpo_jax.rewards.registry import register_reward
from gdpo_jax.tasks.registry import TaskData, register_task
from gdpo_jax.tasks.toy import KWARGS, records

__all__ = ["evaluate", "load", "REWARDS"]

REWARDS = ("three_correct", "three_short", "three_marker")


@register_reward("three_correct")
def correct_reward(
    prompts: Sequence, completions: Sequence[str], *, tool: Sequence[str], **kw
) -> list[float]:
    out = []
    for c, t in zip(completions, tool):
        w = c.split()
        out.append(float(bool(w) and w[0] == t))
    return out


@register_reward("three_short")
def short_reward(
    prompts: Sequence, completions: Sequence[str], *, max_words: int = 3, **kw
) -> list[float]:
    return [float(len(c.split()) <= max_words) for c in completions]


@register_reward("three_marker")
def marker_reward(
    prompts: Sequence, completions: Sequence[str], *, marker: str = "please", **kw
) -> list[float]:
    return [float(marker in c.split()) for c in completions]


def evaluate(completions: Sequence[str], examples: Sequence[dict], **kw) -> dict[str, float]:
    """Held-out means of the three rewards (default options) and of their product ("all")."""
    tools = [e["tool"] for e in examples]
    r = np.array(
        [
            correct_reward(None, completions, tool=tools),
            short_reward(None, completions),
            marker_reward(None, completions),
        ]
    )
    return {
        "correct": float(r[0].mean()),
        "short": float(r[1].mean()),
        "marker": float(r[2].mean()),
        "all": float(r.prod(0).mean()),
    }


@register_task("three_binary", kwargs=KWARGS, synthetic_only=True)
def load(cfg) -> TaskData:
    t = cfg.task
    kw = t.kwargs.to_dict()
    return TaskData(
        train=records(t.num_train, seed=t.seed, split="train", **kw),
        eval=records(t.num_eval, seed=t.seed, split="test", **kw),
        evaluate=evaluate,
    )
