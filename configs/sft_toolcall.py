r"""SFT warm start for the CPU replica: a ~3.6M-parameter Llama learns synthetic tool calls, partly.

A fresh policy (hidden 256, 4 layers, 4 heads / 2 KV heads, the 912-id
synthetic_bpe vocabulary) is fine-tuned on the synthetic ToolRL-format task
(gdpo_jax.data.synthetic) with a deliberately limited budget and label noise,
so that format and correctness are both clearly above zero and clearly below
their maxima: the starting point of experiments/compare_estimators.py.

    python -m experiments.sft --config=configs/sft_toolcall.py \
        --config.workdir=runs/replica/sft_toolcall

Writes <workdir>/hf (the policy + tokenizer as a Hugging Face dir, the RL
config's model.name), <workdir>/sft_result.json (held-out greedy and sampled
metrics), <workdir>/metrics.jsonl. `get_config("runlocal")` is a seconds-long
smoke version (a tiny model, a few steps).
"""

from gdpo_jax.train.schema import sft_config

POLICY = dict(
    hidden_size=256,
    intermediate_size=768,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    max_position_embeddings=256,
)


def get_config(arg: str = ""):
    c = sft_config()
    c.seed = 0
    c.model.tokenizer = "synthetic_bpe"
    c.model.tiny.update(POLICY)

    c.task.name = "toolcall"
    c.task.source = "synthetic"
    c.task.seed = 0
    c.task.num_train = 2048
    c.task.num_eval = 64
    c.task.chat_template = True
    c.rewards.names = ("toolcall_format", "toolcall_correctness")
    c.rewards.num_workers = 1  # microsecond rewards: threads would only cost

    c.sampling.max_prompt_len = 112  # synthetic prompts: <= 103 tokens
    c.sampling.max_new_tokens = 80  # reference answers: <= 73 tokens incl. EOS
    c.sampling.temperature = 1.0

    # The budget that lands "partly solved" (held-out, sampled at T=1: format ~0.8 of 1,
    # correctness ~0.6 of [-3, 3]); by 100 steps the policy does not copy argument
    # values from the request yet, past 200 it keeps improving. Constant lr, so a
    # shorter run equals a prefix of a longer one (batches depend on (seed, step) only).
    c.sft.num_steps = 200
    c.sft.batch_size = 32
    c.sft.num_examples = 0
    c.sft.format_noise = 0.3  # 30% of targets break the tag structure
    c.sft.value_noise = 0.0
    c.sft.log_every = 10
    c.sft.eval_num_examples = 64
    c.sft.eval_samples = 4

    c.optim.lr = 1e-3
    c.optim.schedule = "constant"
    c.optim.warmup_steps = 10
    c.optim.weight_decay = 0.0
    c.optim.max_grad_norm = 1.0

    c.mesh.shape = (-1, 1, 1)
    c.train.tensorboard = False
    c.checkpoint.every = 50
    c.checkpoint.keep = 1
    c.checkpoint.async_save = False

    if arg == "runlocal":
        c.model.tiny.update(
            dict(
                hidden_size=64,
                intermediate_size=128,
                num_layers=2,
                num_heads=4,
                num_kv_heads=2,
                head_dim=16,
            )
        )
        c.task.num_train = 64
        c.task.num_eval = 8
        c.sft.num_steps = 4
        c.optim.warmup_steps = 1  # below the 4 steps (10 warned on every smoke run)
        c.checkpoint.every = 0
        c.sft.batch_size = 8
        c.sft.eval_num_examples = 4
        c.sft.eval_samples = 2
        c.sampling.max_new_tokens = 80
        c.mesh.num_devices = 1
    return c
