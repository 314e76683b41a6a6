r"""The paper's math setting: correctness + length budget on DeepScaleR, GDPO vs GRPO.

Models (variant = first part of the config arg):
  r1-distill-1.5b  deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B   (Qwen2 architecture)
  r1-distill-7b    deepseek-ai/DeepSeek-R1-Distill-Qwen-7B     (Qwen2 architecture)
  qwen3-4b         Qwen/Qwen3-4B-Instruct-2507                 (Qwen3: q/k norm)

Rewards: math_correct {0, 1} (last \boxed{} answer, math-verify) and length
{0, 1} = 1 if the response has <= 4000 tokens. `length=cond` gates the length
reward on correctness (paper eq. 8: length counts only when the answer is
right), the paper's conditioned-reward study; the default is unconditioned.

Hyperparameters (paper Sec. 4.2, a DAPO-style verl run):

  batch 512 prompts x G 16                 algo.num_prompts=512, group_size=16 (8192 rows/step)
  mini-batch 64 prompts                    algo.num_minibatches=8 (1024 rows per update)
  lr 1e-6, 500 steps                       optim.lr, train.num_steps
  clip 0.2 / 0.28 (clip-higher)            algo.clip_low / clip_high
  dynamic sampling                         algo.dynamic_sampling (groups with no spread
                                           dropped, judged per reward under GDPO)
  token-mean loss                          algo.aggregation="dapo"
  KL loss 0.0005, mse estimator            algo.beta=0.0005, kl_estimator="mse"
  response 8000 tokens                     sampling.max_new_tokens=8000
  eval: pass@1 of 16 samples, T 0.6, p .95 eval.num_samples=16, temperature, top_p

Not given by the paper (verl defaults kept): weight decay 0.01, no warmup,
constant lr, no entropy bonus, temperature 1.0 for rollouts, prompt length 1024, at most 4
generation rounds per step to refill a dynamic-sampling batch.

Data: DeepScaleR-Preview-Dataset (40k; {problem, answer} JSON or verl parquet
with reward_model.ground_truth), e.g. verl's examples/data_preprocess output
dir holding train.parquet; held-out set (AIME 2024) via --config.task.eval_source.

Single host, 8 GPUs:

    python -m experiments.train --config=configs/paper_math.py:r1-distill-1.5b \
        --config.model.name=/ckpt/DeepSeek-R1-Distill-Qwen-1.5B \
        --config.task.source=/data/deepscaler --config.task.eval_source=/data/aime24.parquet \
        --config.workdir=/runs/math_r1_1.5b_gdpo
    # conditioned length reward, GRPO baseline:
    python -m experiments.train --config=configs/paper_math.py:r1-distill-7b,length=cond \
        --config.algo.estimator=grpo ...

TPU pod slice (e.g. v5p-128: 64 chips, 16 hosts), the same command on every
host; fsdp over all 64 chips, 1 row of 9k tokens per chip per micro-batch:

        --config.mesh.shape='(1,-1,1)' --config.algo.num_microbatches=16

For the 7B policy on many chips a tensor axis shortens the all-gathers:
--config.mesh.shape='(1,-1,4)' (q/kv heads and MLP split 4 ways; on the pod above,
with its --config.algo.num_microbatches=16: a micro-batch's rows must divide over
data x fsdp).

Memory: 128 micro-batches of 8 rows on 8 devices = 1 row of 9024 tokens per
device at a time, layers rematerialized, log-probs chunked (512 positions).

Generation: 8192 rows x 9024 tokens decode in 16 sampler calls of 512 rows
(sampling.rows_per_call, set by paper_common.set_dapo_recipe): ~33 GB of bf16
KV cache per device on 8 devices for the 7B, half that for the 1.5B; Qwen3-4B
(8 kv heads, 36 layers) uses 64 calls of 128 rows (~21 GB). Check a target
before booking it: python -m experiments.plan --config=... --topology=8xh100.
"""

from __future__ import annotations

try:
    from configs import paper_common as common
except ImportError:  # loaded by path from outside the repository root
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from configs import paper_common as common

from gdpo_jax.tasks import math as math_task
from gdpo_jax.train.config import base_config

VARIANTS = ("r1-distill-1.5b", "r1-distill-7b", "qwen3-4b")
LENGTH_LIMIT = 4000


def get_config(arg: str = ""):
    opts = common.parse_arg(
        arg, variants=VARIANTS, default="r1-distill-1.5b", length=("plain", "cond")
    )
    c = base_config()
    common.set_verl_defaults(c)
    common.set_model(c, opts["model"])

    c.task.name = "math"
    c.task.source = "data/deepscaler"  # --config.task.source=/path/to/deepscaler
    c.task.eval_source = ""  # "" = <source>/test.*; else e.g. an AIME file
    c.task.eval_kwargs.max_tokens = LENGTH_LIMIT  # the Exceed ratio's limit

    c.rewards.names = ("math_correct", "length")
    c.rewards.weights = (1.0, 1.0)
    c.rewards.conditions = ("", "math_correct" if opts["length"] == "cond" else "")
    c.rewards.thresholds = (1.0, 1.0)
    c.rewards.kwargs.length = dict(max_tokens=LENGTH_LIMIT)
    c.rewards.num_workers = 16  # math-verify (sympy) is slow per sample
    # Eight answers per runner task (math.RUNNER_DEFAULTS), each task with its deadline
    # (rewards.timeout_s): 0 split 8192 rows into 16 tasks of 512 comparisons, whose
    # slow ones left the rest of a task unchecked (NaN) at the deadline.
    c.rewards.chunk_size = math_task.RUNNER_DEFAULTS["chunk_size"]

    common.set_dapo_recipe(c, eval_samples=16)
    if opts["model"] == "qwen3-4b":
        # Qwen3-4B keeps 36 layers x 8 kv heads of cache (2.6x R1-Distill-7B's per
        # token): 512 rows per call need 79 GiB of KV cache per device on 8 devices
        # and do not fit an 80 GB GPU (experiments/plan.py, docs/scale.md); 128 do.
        c.sampling.rows_per_call = 128
    return c
