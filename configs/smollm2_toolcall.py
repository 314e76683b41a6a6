r"""A real pretrained policy on CPU: SmolLM2-135M-Instruct learns synthetic tool calling by GDPO.

The policy is the offline SmolLM2-135M-Instruct GGUF (`load_pretrained(
"smollm2-135m-instruct")` converts it once into ~/.cache/gdpo_jax). The data
are gdpo_jax.data.synthetic's tool-calling records (ToolRL format, 8 typed
functions, 2 offered per prompt; source "synthetic"), scored by the paper's two
rewards: toolcall_format {0, 1} and toolcall_correctness [-3, 3], under GDPO.

    python -m experiments.train --config=configs/smollm2_toolcall.py \
        --config.workdir=/tmp/smollm2_tc
    python -m experiments.train --config=configs/smollm2_toolcall.py \
        --config.algo.estimator=grpo --config.workdir=/tmp/smollm2_tc_grpo

Task "toolcall_oneshot" (registered below) is the "toolcall" task with one
change to every prompt: the system message spells out the answer format and
one worked example exchange comes before the request, as ToolRL's real system
prompt carries a format template. The synthetic prompt alone is written for
from-scratch toy policies; with it, SmolLM2-135M never writes the tags (all
16 samples of a batch score format 0 / correctness -3: no group has any
spread, every advantage is 0 and RL cannot start). With the example, many of
its samples are well formatted at temperature 0.7 (the first window of the
sampled format reward in docs/results.md) and most groups carry signal.

What a 20-step run costs on a 2-core CPU and what moves in it (step-0 and
held-out evals, sampled rewards by window, entropy): docs/results.md, "SmolLM2-135M
on CPU", written by `python -m experiments.smollm2_demo`. Changes from the
paper's tool-calling settings, for a 135M model and a 16-row batch: lr 2e-5
(the paper's 1e-6 is for 100 steps of 2048 rows; not tuned further), rollout
temperature 0.7 (at 1.0 a 135M model writes noise), 2 updates per batch, no KL
(saves the reference forward), old log-probs from the sampler (saves a
forward).
`get_config("runlocal")`: 2 steps (smoke test).
"""

from __future__ import annotations

import ml_collections as mlc

from gdpo_jax import tasks
from gdpo_jax.train.config import base_config

FORMAT = (
    "Answer in this format:\n<think>which tool to use</think>\n<tool_call>\n"
    '{"name":"tool_name","parameters":{"arg":"value"}}\n</tool_call>\n'
    "One JSON line per call. If no tool fits: <think>no tool needed</think>\n"
    "<response>your reply</response>"
)
EXAMPLE = [
    {"role": "user", "content": "Weather in Oslo in celsius?"},
    {
        "role": "assistant",
        "content": "<think>use get_weather</think>\n<tool_call>\n"
        '{"name":"get_weather","parameters":{"city":"Oslo","unit":"celsius"}}\n</tool_call>',
    },
]


def one_shot(record: dict) -> dict:
    """The record with the format spelled out and one example exchange in its prompt."""
    system, *rest = record["prompt"]
    tools = [ln for ln in system["content"].split("\n")[1:] if "(" in ln and ":" in ln]
    header = "You can call these tools:\n" + "\n".join(tools) + "\n" + FORMAT
    return dict(record, prompt=[{"role": "system", "content": header}, *EXAMPLE, *rest])


# The plain task's kwargs table: validate_config then checks them before any work.
@tasks.register_task("toolcall_oneshot", kwargs=tasks.task_kwargs("toolcall"))
def _load_one_shot(cfg) -> tasks.TaskData:
    base = mlc.ConfigDict(cfg.to_dict())  # an unlocked copy, asking for the plain task
    base.task.name = "toolcall"
    data = tasks.load_task(base)
    return tasks.TaskData(
        train=[one_shot(r) for r in data.train],
        eval=[one_shot(r) for r in data.eval],
        evaluate=data.evaluate,
    )


def get_config(arg: str = ""):
    if arg not in ("", "runlocal"):
        raise ValueError(
            f"configs/smollm2_toolcall.py: unknown option {arg!r}; use '' or 'runlocal'."
        )
    c = base_config()
    c.seed = 0

    c.model.name = "smollm2-135m-instruct"
    c.model.dtype = "float32"  # bf16 matmuls are slower than f32 on most CPUs
    c.model.param_dtype = "float32"
    c.model.remat = False

    c.task.name = "toolcall_oneshot"
    c.task.source = "synthetic"
    c.task.seed = 0
    c.task.num_train = 512
    c.task.num_eval = 16
    c.task.kwargs.n_tools = 2
    c.task.chat_template = True

    c.rewards.names = ("toolcall_format", "toolcall_correctness")
    c.rewards.weights = (1.0, 1.0)
    c.rewards.num_workers = 1  # microsecond string rewards

    c.algo.estimator = "gdpo"
    c.algo.num_prompts = 4
    c.algo.group_size = 4
    c.algo.num_minibatches = 2  # 2 updates per batch for the compute of 1
    # 2 x 4 rows (one group each) per update: 1.12x faster per step than one 8-row pass on
    # a 2-core CPU (`make tune`, docs/training.md); 4 would split groups (no prompt sharing).
    c.algo.num_microbatches = 2
    c.algo.clip_low = 0.2
    c.algo.clip_high = 0.2
    c.algo.beta = 0.0
    c.algo.kl_in_reward = 0.0
    c.algo.entropy_coef = 0.0
    c.algo.aggregation = "dapo"
    c.algo.old_logprobs = "sampler"

    c.sampling.max_prompt_len = 240  # the longest one-shot prompt has 232 tokens
    c.sampling.max_new_tokens = 96  # a two-call answer is ~75 tokens
    c.sampling.temperature = 0.7

    c.eval.greedy = True

    c.optim.lr = 2e-5
    c.optim.schedule = "constant"
    c.optim.warmup_steps = 0
    c.optim.weight_decay = 0.0
    c.optim.max_grad_norm = 1.0

    c.mesh.shape = (-1, 1, 1)

    c.train.num_steps = 20
    c.train.eval_every = 10  # greedy, on the 16 held-out prompts
    c.checkpoint.every = 10
    c.checkpoint.keep = 1

    if arg == "runlocal":
        c.train.num_steps = 2
        c.checkpoint.every = 0
    return c
