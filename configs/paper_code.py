r"""The paper's code setting: DeepSeek-R1-Distill-Qwen-7B on Eurus-2-RL code, 2 or 3 objectives.

Rewards (paper Sec. 4.3; the 4000-token limit as for math, the paper leaving it open):
  code_pass_rate [0, 1]   share of the problem's tests the last ```python block passes
  length {0, 1}           1 if <= 4000 tokens, conditioned on pass_rate == 1 (eq. 8)
  code_bug {0, 1}         1 if the program compiles and raises no runtime error
`objectives=2` (the default, `:r1-distill-7b`) uses the first two;
`:r1-distill-1.5b` is not in the paper: a smaller stand-in for the 7B model.
`objectives=3` adds code_bug. Programs run in gdpo_jax's sandbox (one
subprocess per program, shared by pass rate and bug: one execution each).

Hyperparameters: the paper trains code like math (its Sec. 4.2 DAPO-style
recipe), so this config uses the values of configs/paper_math.py but the eval's
sample count (4 per problem, math 16):
batch 512 prompts x G 16, mini-batch 64 prompts, lr 1e-6, clip 0.2 / 0.28,
dynamic sampling, token-mean loss, KL loss 0.0005 (mse), response 8000 tokens,
500 steps. Eval: 4 samples per problem at T 0.6, top-p 0.95 (pass rate,
exceed ratio, bug ratio).

Data: Eurus-2-RL-Data (PRIME-RL), its code rows in verl format (prompt,
reward_model.ground_truth = JSON {"inputs", "outputs"[, "fn_name"]}); a dir
with train.parquet, and --config.task.eval_source for validation.parquet.

Single host, 8 GPUs:

    python -m experiments.train --config=configs/paper_code.py:r1-distill-7b,objectives=3 \
        --config.model.name=/ckpt/DeepSeek-R1-Distill-Qwen-7B \
        --config.task.source=/data/eurus2_code \
        --config.task.eval_source=/data/eurus2_code/validation.parquet \
        --config.workdir=/runs/code_r1_7b_gdpo3
    # GRPO baseline: add --config.algo.estimator=grpo

TPU pod slice (e.g. v5p-128: 64 chips, 16 hosts): same command on every host,
plus --config.algo.num_microbatches=16 (1 row per chip per micro-batch).
The reward sandbox runs on each host's CPUs for that host's rollouts;
rewards.num_workers sets the parallel programs per host.

Generation: 16 sampler calls of 512 rows (sampling.rows_per_call), as math.
"""

from __future__ import annotations

try:
    from configs import paper_common as common
except ImportError:  # loaded by path from outside the repository root
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from configs import paper_common as common

from gdpo_jax.tasks import code as code_task
from gdpo_jax.train.config import base_config

VARIANTS = ("r1-distill-7b", "r1-distill-1.5b")
LENGTH_LIMIT = 4000


def get_config(arg: str = ""):
    opts = common.parse_arg(arg, variants=VARIANTS, default="r1-distill-7b", objectives=("2", "3"))
    c = base_config()
    common.set_verl_defaults(c)
    common.set_model(c, opts["model"])

    c.task.name = "code"
    c.task.source = "data/eurus2_code"  # --config.task.source=/path/to/eurus2 code split
    c.task.eval_source = ""
    c.task.eval_kwargs.max_tokens = LENGTH_LIMIT

    names = ["code_pass_rate", "length"] + (["code_bug"] if opts["objectives"] == "3" else [])
    c.rewards.names = tuple(names)
    c.rewards.weights = (1.0,) * len(names)
    c.rewards.conditions = tuple("code_pass_rate" if n == "length" else "" for n in names)
    c.rewards.thresholds = (1.0,) * len(names)  # length counts only when every test passes
    c.rewards.kwargs.length = dict(max_tokens=LENGTH_LIMIT)
    # One program per runner task (code.RUNNER_DEFAULTS), so the deadline is per
    # program (all its tests); 64 sandboxed programs run at once per host.
    c.rewards.num_workers = 64
    c.rewards.chunk_size = code_task.RUNNER_DEFAULTS["chunk_size"]
    c.rewards.timeout_s = code_task.RUNNER_DEFAULTS["timeout_s"]

    common.set_dapo_recipe(c, eval_samples=4)
    return c
