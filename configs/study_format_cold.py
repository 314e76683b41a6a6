r"""Study: format-cold tool calling (issue 16), RL from configs/sft_format_cold.py.

configs/replica_toolcall.py (the paper's rewards: toolcall_format {0, 1} +
toolcall_correctness [-3, 3], G = 4, clip 0.2, T = 1, constant lr 5e-5) from
a warm start that samples the format right only ~0.1-0.3 of the time (measured 0.35), so
the small-scale format reward has room to climb. Shorter than the replica
(40 steps, held-out eval of 32 prompts x 2 samples every 10 steps) so that
3 estimators x 10 seeds fit in well under an hour on 2 cores. Every
estimator gets exactly this config; only algo.estimator and seed change.

    python -m experiments.compare_estimators --study=format_cold

`get_config("quick")`: CI size.
"""

from configs.replica_toolcall import get_config as _replica

WARM_START = "runs/study/format_cold/sft/hf"


def get_config(arg: str = ""):
    if arg not in ("", "quick"):
        raise ValueError(
            f"configs/study_format_cold.py: unknown option {arg!r}; use '' or 'quick'."
        )
    c = _replica(arg)
    c.model.name = WARM_START
    c.train.tensorboard = False
    if arg != "quick":
        c.train.num_steps = 40
        c.train.eval_every = 10
        c.train.eval_num_examples = 32
    return c
