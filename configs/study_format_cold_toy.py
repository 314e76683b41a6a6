r"""Study: format-cold at toy size (issue 16): format {0,1} + correctness [-3,3], G = 4.

The tool-calling study's reward scales on the toy requests (gdpo_jax.tasks.toy),
RL from a random-init 0.8M-parameter policy, which samples the format (first
word a tool name) ~0.18 of the time and gets correctness ~-2.8 of [-3, 3] (step 0
in docs/results/format_cold_toy/results.md):
toy_format {0, 1} + toy_correct_pm3 = 6 * toy_correct - 3 (gdpo_jax.tasks.format_cold_toy),
weights 1, G = 4 as in the paper, 8 prompts/step, 60 steps. The CPU-cheap
stand-in for configs/study_format_cold.py, whose SFT warm start alone takes
longer than a loaded 2-core machine allows. Only algo.estimator and seed
change between runs.

    python -m experiments.compare_estimators --study=format_cold_toy
"""

from configs.study_three_binary import get_config as _three


def get_config(arg: str = ""):
    if arg not in ("", "quick"):
        raise ValueError(
            f"configs/study_format_cold_toy.py: unknown option {arg!r}; use '' or 'quick'."
        )
    c = _three(arg)
    c.task.name = "toy_toolcall"
    c.rewards.names = ("toy_format", "toy_correct_pm3")
    c.rewards.weights = (1.0, 1.0)
    c.algo.group_size = 4  # paper: G = 4
    return c
