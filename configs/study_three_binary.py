r"""Study: three independent binary rewards of different base rates, G = 8 (issue 16).

RL from a random-init 0.8M-parameter policy (the tiny CPU model) on the toy
requests of gdpo_jax.tasks.three_binary: three_correct (rarest at the
start), three_short, three_marker, all {0, 1}, weights 1. Every estimator gets
exactly this config; only algo.estimator and seed change (the seed also sets
the initial weights, identical across estimators of one seed).

    python -m experiments.compare_estimators --study=three_binary
    python -m experiments.train --config=configs/study_three_binary.py \
        --config.algo.estimator=gdpo --config.workdir=/tmp/three_gdpo

`get_config("quick")`: CI size (a few steps, learns nothing).
"""

from configs.tiny_cpu import get_config as _tiny


def get_config(arg: str = ""):
    if arg not in ("", "quick"):
        raise ValueError(
            f"configs/study_three_binary.py: unknown option {arg!r}; use '' or 'quick'."
        )
    c = _tiny("runlocal" if arg == "quick" else "")
    c.task.name = "three_binary"
    c.task.num_eval = 64
    c.rewards.names = ("three_correct", "three_short", "three_marker")
    c.rewards.weights = (1.0, 1.0, 1.0)
    c.algo.group_size = 8
    c.algo.num_prompts = 8
    c.algo.num_minibatches = 2
    c.optim.schedule = "constant"  # a prefix of a longer run is a shorter run
    c.optim.warmup_steps = 0
    c.eval.greedy = False  # RL optimises the sampled policy: evaluate it
    c.eval.temperature = 1.0
    c.eval.top_p = 1.0
    c.eval.num_samples = 2
    c.train.num_steps = 60
    c.train.eval_every = 20
    c.train.eval_num_examples = 32
    c.train.tensorboard = False
    c.train.progress_bar = False
    c.checkpoint.every = 20
    c.checkpoint.keep = 1
    if arg == "quick":
        c.task.num_train = 64
        c.task.num_eval = 8
        c.algo.num_prompts = 2
        c.algo.num_minibatches = 1
        c.train.num_steps = 2
        c.train.eval_every = 2
        c.train.eval_num_examples = 4
        c.checkpoint.every = 1
        c.mesh.num_devices = 1
    return c
