r"""CPU replica of the paper's tool-calling study: RL from the SFT warm start (sft_toolcall.py).

Rewards as in the paper (ToolRL): toolcall_format {0,1} + toolcall_correctness
[-3,3], G = 4, clip 0.2, temperature 1.0, constant lr; a 3.6M-parameter policy
on the synthetic task instead of Qwen2.5 on ToolRL data, and a CPU-sized
batch (8 prompts x 4). Every estimator gets exactly this config; only
algo.estimator and seed change (experiments/compare_estimators.py).

    python -m experiments.sft --config=configs/sft_toolcall.py \
        --config.workdir=runs/replica/sft_toolcall
    python -m experiments.train --config=configs/replica_toolcall.py \
        --config.model.name=runs/replica/sft_toolcall/hf --config.algo.estimator=gdpo \
        --config.workdir=runs/replica/toolcall/gdpo_s0

`get_config("quick")` is the CI-sized version (2 steps, tiny eval).
"""

from gdpo_jax.train.config import base_config

WARM_START = "runs/replica/sft_toolcall/hf"


def get_config(arg: str = ""):
    if arg not in ("", "quick"):
        raise ValueError(f"configs/replica_toolcall.py: unknown option {arg!r}; use '' or 'quick'.")
    c = base_config()
    c.seed = 0
    c.model.name = WARM_START  # the SFT export (an HF dir); compare_estimators sets it

    c.task.name = "toolcall"
    c.task.source = "synthetic"
    c.task.seed = 0  # same data (and held-out split) as the SFT
    c.task.num_train = 2048
    c.task.num_eval = 64
    c.task.chat_template = True

    c.rewards.names = ("toolcall_format", "toolcall_correctness")
    c.rewards.weights = (1.0, 1.0)
    c.rewards.num_workers = 1

    c.algo.group_size = 4  # paper: G = 4
    c.algo.num_prompts = 8
    c.algo.clip_low = 0.2
    c.algo.clip_high = 0.2
    c.algo.beta = 0.0  # no KL loss
    c.algo.kl_in_reward = 0.0  # paper: KL 0.001 in the reward; off here (no ref pass)
    c.algo.aggregation = "grpo"
    c.algo.num_minibatches = 2  # paper: batch 512 / mini-batch 128 = 4 updates

    c.sampling.max_prompt_len = 112
    c.sampling.max_new_tokens = 80
    c.sampling.temperature = 1.0

    # Held-out eval samples like training (T = 1, 2 per prompt): greedy decoding of
    # the warm start already has the format right, and RL optimizes the sampled policy.
    c.eval.greedy = False
    c.eval.temperature = 1.0
    c.eval.top_p = 1.0
    c.eval.num_samples = 2

    c.optim.lr = 5e-5  # one value for every estimator
    c.optim.schedule = "constant"
    c.optim.warmup_steps = 0
    c.optim.max_grad_norm = 1.0

    c.train.num_steps = 60
    c.train.eval_every = 20
    c.train.eval_num_examples = 64
    c.train.tensorboard = True  # <workdir>/tb: reward/*, adv/*, loss/*, perf/*, time/*
    c.train.progress_bar = False
    # A killed comparison resumes each unfinished run from its last checkpoint;
    # compare_estimators removes a run's checkpoints once it has finished.
    c.checkpoint.every = 10
    c.checkpoint.keep = 1

    if arg == "quick":
        c.task.num_train = 64
        c.task.num_eval = 8
        c.train.num_steps = 2
        c.train.eval_every = 2
        c.train.eval_num_examples = 4
        c.checkpoint.every = 1
        c.algo.num_prompts = 2
        c.algo.num_minibatches = 1
        c.sampling.max_new_tokens = 16
        c.mesh.num_devices = 1
    return c
