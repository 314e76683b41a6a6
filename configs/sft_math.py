r"""SFT warm start for the math replica: a 3.6M-parameter policy partly learns synthetic arithmetic.

Word problems from gdpo_jax.data.synthetic (1-3 steps: add, subtract, packs
of k), answers in \boxed{}. Half of the targets restate the problem before
the worked answer (sft.verbose_prob), so the warm start often overruns the
length budget of configs/replica_math.py (40 tokens): the setting of the
paper's length-conditioned math study, where RL must raise correctness
while bringing the Exceed ratio down.

    python -m experiments.sft --config=configs/sft_math.py --config.workdir=runs/replica/math/sft

`get_config("runlocal")`: a tiny, seconds-long smoke version.
"""

from configs.sft_toolcall import get_config as _toolcall_sft

LENGTH_BUDGET = 40  # tokens (incl. EOS); the paper's L = 4000 at 8000-token responses


def get_config(arg: str = ""):
    c = _toolcall_sft(arg)
    c.task.name = "math"
    c.task.num_train = 2048
    c.task.num_eval = 64 if arg != "runlocal" else 8
    c.task.eval_kwargs.max_tokens = LENGTH_BUDGET
    c.rewards.names = ("math_correct", "length")
    c.rewards.conditions = ("", "math_correct")
    c.rewards.thresholds = (1.0, 1.0)
    c.rewards.kwargs.length = dict(max_tokens=LENGTH_BUDGET)
    c.sampling.max_prompt_len = 64  # synthetic word problems: <= 56 tokens
    c.sampling.max_new_tokens = 96 if arg != "runlocal" else 48
    c.sft.format_noise = 0.0
    c.sft.value_noise = 0.0
    c.sft.verbose_prob = 0.5
    # Arithmetic is slower to learn than the tool-call format: at 200 steps held-out
    # correctness is ~2-5%, at 600 ~14% sampled / ~31% greedy (our run).
    c.sft.num_steps = 600 if arg != "runlocal" else 4
    return c
