r"""Tiny CPU run: a 0.8M-parameter random-init Llama learns the toy tool-calling task by GDPO.

Three rewards (toy_format, toy_correct, toy_length; see
gdpo_jax/tasks/toy.py), 16 prompts x 8 generations per step, 300 steps, a
few minutes at most on a 2-core CPU. All three rewards climb from where a
random policy starts (each run's curves: <workdir>/plots/); metrics in
<workdir>/metrics.jsonl and <workdir>/tb (TensorBoard).

    python -m experiments.train --config=configs/tiny_cpu.py --config.workdir=/tmp/gdpo_tiny
    python -m experiments.train --config=configs/tiny_cpu.py \
        --config.algo.estimator=grpo --config.workdir=/tmp/grpo_tiny

`get_config("runlocal")` shortens it to a handful of steps (smoke tests).
"""

from gdpo_jax.train.config import base_config


def get_config(arg: str = ""):
    if arg not in ("", "runlocal"):
        raise ValueError(f"configs/tiny_cpu.py: unknown option {arg!r}; use '' or 'runlocal'.")
    c = base_config()
    c.seed = 0
    c.workdir = ""

    c.model.tokenizer = "toy_words"
    c.model.tiny.update(
        dict(
            hidden_size=128,
            intermediate_size=384,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            head_dim=32,
            max_position_embeddings=64,
        )
    )

    c.task.name = "toy_toolcall"
    c.task.chat_template = False  # plain-text prompts
    c.task.num_train = 4096
    c.task.num_eval = 64
    c.task.kwargs.filler = 0.0  # fixed word positions: the copy is learnable from scratch
    c.task.kwargs.num_tools = 4  # 4 tools x 8 argument words: chance hits are frequent
    c.task.kwargs.num_args = 8

    c.rewards.names = ("toy_format", "toy_correct", "toy_length")
    c.rewards.weights = (1.0, 2.0, 1.0)  # correctness is the hard one
    c.rewards.num_workers = 1  # the rewards are microseconds; threads would only cost

    c.algo.estimator = "gdpo"
    c.algo.group_size = 8
    c.algo.num_prompts = 16
    c.algo.clip_low = 0.2
    c.algo.clip_high = 0.28
    c.algo.aggregation = "grpo"
    c.algo.num_minibatches = 2  # two PPO updates per rollout batch

    c.sampling.max_prompt_len = 8
    c.sampling.max_new_tokens = 8
    c.sampling.temperature = 1.0

    c.eval.greedy = True

    c.optim.lr = 5e-4  # 1e-3 collapses onto short, wrong answers
    c.optim.warmup_steps = 5
    c.optim.schedule = "cosine"
    c.optim.min_lr_ratio = 0.1
    c.optim.weight_decay = 0.0
    c.optim.max_grad_norm = 1.0

    c.mesh.shape = (-1, 1, 1)

    c.train.num_steps = 300
    c.train.eval_every = 50
    c.checkpoint.every = 100
    c.checkpoint.keep = 2

    if arg == "runlocal":
        c.train.num_steps = 4
        c.optim.warmup_steps = 1  # below the 4 steps (5 warned on every smoke run)
        c.train.eval_every = 2
        c.checkpoint.every = 2
        c.task.num_eval = 8
    return c
