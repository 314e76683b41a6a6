"""A [-3, 3] correctness reward for the toy requests: the paper's reward scales at toy size.

``toy_correct_pm3 = 6 * toy_correct - 3``, the ToolRL formula (6 * match /
max_possible - 3) applied to the toy task's match score (tool + two
arguments, ``gdpo_jax.tasks.toy``). With ``toy_format`` {0, 1} it gives
the tool-calling study's reward scales (format {0, 1}, correctness [-3, 3]) on
a task that a random-init policy learns in minutes on a CPU, and that policy
starts format-cold (format ~0.18 at step 0, docs/results/format_cold_toy):
configs/study_format_cold_toy.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from gdpo_jax.rewards.registry import register_reward
from gdpo_jax.tasks.toy import correct_reward

__all__ = ["correct_pm3_reward"]


@register_reward("toy_correct_pm3")
def correct_pm3_reward(prompts: Sequence, completions: Sequence[str], **kw) -> list[float]:
    return [6.0 * c - 3.0 for c in correct_reward(prompts, completions, **kw)]
