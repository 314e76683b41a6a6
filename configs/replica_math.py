r"""CPU replica of the paper's math study: correctness + a length budget gated on correctness.

Rewards: math_correct {0,1} and length {0,1} (<= 40 tokens), the length
reward counted only when the answer is correct (paper eq. 8, via
config.rewards.conditions). From the SFT warm start of configs/sft_math.py;
G = 8 (paper: 16), clip 0.2 / 0.28 and a token-mean loss as in the paper;
no KL, no dynamic sampling (CPU budget). Held-out: pass@1 over 2 samples
per problem at T = 1 and the Exceed ratio (share of answers over 40 tokens).

    python -m experiments.sft --config=configs/sft_math.py --config.workdir=runs/replica/math/sft
    python -m experiments.train --config=configs/replica_math.py \
        --config.model.name=runs/replica/math/sft/hf --config.algo.estimator=gdpo \
        --config.workdir=runs/replica/math/runs/gdpo/seed0
"""

from configs.replica_toolcall import get_config as _toolcall_rl
from configs.sft_math import LENGTH_BUDGET

WARM_START = "runs/replica/math/sft/hf"


def get_config(arg: str = ""):
    """arg: comma-separated options: "quick" (CI size), "plain" (length reward
    not gated on correctness: the paper's main math setting, where (right, long)
    and (wrong, short) tie under GRPO's sum)."""
    opts = set(filter(None, arg.split(",")))
    unknown = opts - {"quick", "plain"}
    if unknown:
        raise ValueError(
            f"configs/replica_math.py: unknown option(s) {sorted(unknown)}; "
            "use 'quick' and/or 'plain'."
        )
    arg = "quick" if "quick" in opts else ""
    c = _toolcall_rl(arg)
    c.model.name = WARM_START
    c.task.name = "math"
    c.task.eval_kwargs.max_tokens = LENGTH_BUDGET
    c.rewards.names = ("math_correct", "length")
    c.rewards.weights = (1.0, 1.0)
    c.rewards.conditions = ("", "" if "plain" in opts else "math_correct")
    c.rewards.thresholds = (1.0, 1.0)
    c.rewards.kwargs.length = dict(max_tokens=LENGTH_BUDGET)
    c.algo.group_size = 8
    c.algo.num_prompts = 4 if arg != "quick" else 1
    c.algo.clip_high = 0.28
    c.algo.aggregation = "dapo"  # token-mean loss
    c.sampling.max_prompt_len = 64
    c.sampling.max_new_tokens = 96 if arg != "quick" else 16
    return c
