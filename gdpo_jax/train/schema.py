"""The run configuration's schema (`base_config`, and `sft_config` for SFT) and its
identity (fingerprint, diff).

Every experiment config (configs/*.py) starts from `base_config()` and
overrides fields, so the command line can override any of them with
`--config.a.b=value` (absl `config_flags`, locked: a typo is an error).
"Off" is spelled 0 / "" rather than None, so that every field has a type the
command line can parse. Validation lives in `gdpo_jax.train.config`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from typing import Any

import ml_collections as mlc

from gdpo_jax.errors import ConfigError

# Fields that may change between a checkpoint and the run resuming from it:
# they do not change what a step computes, only how long / how often. One
# exception: train.num_steps is also the horizon of a cosine / linear learning-rate
# decay, so changing it on resume changes the learning rates of the steps left.
RESUMABLE_FIELDS = (
    "workdir",
    "train.num_steps",
    "train.stop_after_step",
    "train.log_every",
    "train.eval_every",
    "train.eval_num_examples",
    "train.progress_bar",
    "checkpoint.",
    "distributed.",
    "train.tensorboard",
    "benchmark.",
    # The layout, not the maths: a run moved to another allocation restores its arrays
    # onto the new mesh (the same numbers, except where the batch shards switch the
    # mini-batch unit between groups and rows: docs/limits.md).
    "mesh.",
    # Memory, not maths: lowered to fit a decode after an OOM (same rollouts: each row
    # keeps its random stream, keyed by its index in the whole batch).
    "sampling.rows_per_call",
    "sampling.decode_phases",  # the decode's cache growth (same tokens, per-row keys)
    "sampling.decode_growth",
    # How rewards are computed, not what they are.
    "rewards.num_workers",
    "rewards.executor",
    "rewards.executors",
    "rewards.chunk_size",
    "rewards.overlap",
    "rewards.sandbox.",
)


def base_config() -> mlc.ConfigDict:
    """Every field a run reads, with defaults. Experiment configs override these."""
    c = mlc.ConfigDict()
    c.seed = 0
    c.workdir = ""
    # Modules imported first (by validate_config, so by the CLI and train(), and by
    # every reward worker process): where custom rewards / tasks / tokenizers register.
    c.imports = ()

    c.model = mlc.ConfigDict()
    c.model.name = ""  # load_pretrained(name) (HF dir or registered name); "" = random init
    c.model.tiny = mlc.ConfigDict()  # ModelConfig.tiny(**model.tiny) overrides, when name == ""
    c.model.tokenizer = ""  # tokenizer for a random-init model (gdpo_jax.data.tokenizer_registry)
    c.model.dtype = "float32"  # compute dtype
    c.model.param_dtype = "float32"
    c.model.remat = False  # rematerialize each layer in the backward (jax.checkpoint)
    # What a rematerialized layer keeps: full (its input: the backward re-runs the
    # layer) | dots (also its weight products' outputs: re-runs norms, RoPE, attention).
    c.model.remat_policy = "full"
    # Multi-token attention kernel: auto (cuDNN flash on GPU in bf16/f16, splash on
    # TPU, else xla) | xla (einsum path) | dpa (jax.nn.dot_product_attention, XLA) |
    # cudnn | splash (Pallas TPU kernel).
    c.model.attention = "auto"
    # Layers as one lax.scan (one layer compiled) or unrolled (False: faster steps
    # for few-layer models on CPU, longer compiles; docs/benchmarks.md).
    c.model.scan_layers = True

    c.task = mlc.ConfigDict()
    # A registered task: toolcall | math | code | toy_toolcall | three_binary | your own
    # (config.imports).
    c.task.name = "toolcall"
    c.task.source = "synthetic"  # "synthetic" or a file / glob / directory the task loader reads
    c.task.eval_source = ""  # held-out data; "" = split "test" of a `source` dir (file: no eval)
    c.task.seed = 0  # synthetic data seed (independent of the run's seed)
    # Records: synthetic = how many to generate; a file source = its first N (0 = all).
    c.task.num_train = 2048
    c.task.num_eval = 64
    c.task.kwargs = mlc.ConfigDict()  # synthetic generator keyword arguments
    c.task.eval_kwargs = mlc.ConfigDict()  # the task's evaluate() keyword arguments
    c.task.chat_template = True

    c.rewards = mlc.ConfigDict()
    c.rewards.names = ("toolcall_format", "toolcall_correctness")
    c.rewards.weights = ()  # () = all ones; else one weight per name
    c.rewards.conditions = ()  # () or one "other_reward_name" / "" per name (paper eq. 8)
    c.rewards.thresholds = ()  # () or one threshold per name (used with conditions)
    c.rewards.kwargs = mlc.ConfigDict()  # reward name -> dict of keyword args
    c.rewards.on_error = (
        "raise"  # "raise": stop with the reward's name and sample; "nan": score NaN
    )
    c.rewards.num_workers = 4
    c.rewards.executor = "thread"  # "process" for CPU-bound rewards (sympy, parsing): no GIL
    c.rewards.executors = ()  # () or one "" / "thread" / "process" per name (overrides executor)
    c.rewards.chunk_size = 0  # completions per task; 0 = ceil(rows / num_workers)
    c.rewards.timeout_s = 30.0
    # Score each sampler chunk (sampling.rows_per_call) on a background thread while
    # the next chunk decodes; same rewards as scoring after the last chunk.
    c.rewards.overlap = True
    # The code rewards' sandbox (gdpo_jax.rewards.sandbox): isolation mode and
    # whether "auto" may fall back to the weak modes (setuid, rlimits: the
    # generated code reaches the network); naming a mode is an opt-in too.
    c.rewards.sandbox = mlc.ConfigDict()
    c.rewards.sandbox.isolation = "auto"  # auto | namespaces | userns | setuid | rlimits
    c.rewards.sandbox.allow_weak = False

    c.algo = mlc.ConfigDict()
    c.algo.estimator = "gdpo"  # grpo | grpo_no_std | gdpo | gdpo_no_bn
    c.algo.eps = 1e-4
    c.algo.batch_norm = "sample"  # sample (TRL patch) | token (verl patch)
    # Unscorable (NaN) rewards under GDPO: omit (TRL main: out of the group statistics,
    # 0 advantage) | zero (the official TRL patch's nan_to_num: a 0 reward in them).
    c.algo.nan_rewards = "omit"
    c.algo.group_size = 4  # G generations per prompt
    c.algo.num_prompts = 8  # prompts per rollout batch (global, all hosts)
    c.algo.clip_low = 0.2
    c.algo.clip_high = 0.2
    c.algo.dual_clip = 0.0  # 0 = off; verl's clip_ratio_c (e.g. 3.0)
    c.algo.beta = 0.0  # KL-in-loss coefficient; 0 (and kl_in_reward 0) skips the reference
    c.algo.kl_estimator = "k3"  # k1 | k3 | mse
    # KL coefficient in the reward (paper's tool calling GRPO: 0.001): a per-sequence
    # penalty -coef * KL added after GDPO's per-reward normalization (not a reward column).
    c.algo.kl_in_reward = 0.0
    # Its per-token estimator, summed over the response: k1 is verl's default
    # (algorithm.kl_penalty "kl"); k3 = low_var_kl, mse as for the loss.
    c.algo.kl_in_reward_estimator = "k1"
    c.algo.entropy_coef = 0.0
    c.algo.aggregation = "grpo"  # grpo | bnpo | dapo | dr_grpo
    c.algo.max_len = 0  # dr_grpo's constant; 0 = sampling.max_new_tokens
    c.algo.num_minibatches = 1  # optimizer updates per rollout batch and epoch
    c.algo.num_epochs = 1
    c.algo.num_microbatches = 1  # gradient accumulation steps per update
    c.algo.old_logprobs = "sampler"  # sampler | recompute
    c.algo.dynamic_sampling = False  # drop groups with no spread (per reward under GDPO), refill
    c.algo.dynamic_sampling_max_tries = 4
    c.algo.logprob_chunk_size = 0  # >0: chunked log-softmax, never [B, T, V] at once
    # Run each prompt once per micro-batch, not once per completion (same maths; the
    # mini-/micro-batch split is the same with or without it). Applies when every
    # device's micro-batch is whole groups (num_prompts divisible by batch shards x
    # num_minibatches x num_microbatches); otherwise the per-row forward is used.
    c.algo.share_prompt = True

    c.sampling = mlc.ConfigDict()
    c.sampling.max_prompt_len = 128
    # Prompt widths (ascending, the last = max_prompt_len) that a batch's prompts are
    # left padded to, in the sampler and the step: the widest prompt's bucket. () =
    # automatic: max_prompt_len and up to 3 halvings (>= 16): 2048 -> 256..2048.
    c.sampling.prompt_buckets = ()
    c.sampling.max_new_tokens = 64
    c.sampling.temperature = 1.0
    c.sampling.top_k = 0
    c.sampling.top_p = 1.0
    c.sampling.stop_strings = ()
    # Global rows (prompts x G) per Sampler.generate call; 0 = the whole rollout
    # batch at once. Bounds the KV cache of one decode at paper scale.
    c.sampling.rows_per_call = 0
    # > 0: continuous batching with this many decode slots per batch shard (a row
    # that finishes hands its slot to a waiting row of its shard). Greedy and
    # sampled rows equal the static decode's (per-row key streams).
    c.sampling.continuous_slots = 0
    # How the decode loop runs the layers: "auto" (fused on CPU in f32 on one device,
    # unrolled on CPU in f32 under a mesh, fused on one GPU in bf16 / f16, else the
    # scan), "scan", "unrolled" or "fused"; same tokens (docs/sampling.md).
    c.sampling.decode_layers = "auto"
    # Decode phases, static or continuous (early steps read fewer, empty, slots);
    # 0 = auto: one per 32 new tokens, at most 4. 1 = every step reads all slots.
    c.sampling.decode_phases = 0
    # How the phases get their slots: "prefix" (one cache of all slots, each
    # phase reads a prefix of it: one phase's memory), "copy" (a longer cache
    # per phase: the step into a phase holds both), or "auto" (copy for the
    # unrolled decode forms on CPU, else prefix); same tokens (docs/sampling.md).
    c.sampling.decode_growth = "auto"
    # Keep each prompt's KV cache once for its G rows, not a copy per row
    # (fewer cache reads and G-fold less prompt KV memory; same tokens).
    c.sampling.share_prompt_cache = True
    # > 0 (continuous batching, share_prompt_cache, G > 1): lanes read their
    # prompts from this many shared prompt slots per batch shard instead of a
    # copy per lane (fewer prompt KV reads per step; rows may wait for a slot;
    # docs/sampling.md). 0 = a copy per lane.
    c.sampling.continuous_prompt_slots = 0

    c.eval = mlc.ConfigDict()
    c.eval.greedy = True
    c.eval.num_samples = 1
    c.eval.temperature = 0.6
    c.eval.top_p = 0.95

    c.optim = mlc.ConfigDict()
    c.optim.lr = 1e-6
    c.optim.schedule = "constant"  # cosine | constant | linear (after warmup)
    c.optim.warmup_steps = 0
    c.optim.min_lr_ratio = 0.0
    c.optim.weight_decay = 0.0
    # all: decay every parameter (verl); no_bias_norm: not biases and norm weights
    # (Hugging Face's Trainer, so TRL).
    c.optim.decay_mask = "all"
    c.optim.b1 = 0.9
    c.optim.b2 = 0.999
    c.optim.eps = 1e-8
    c.optim.max_grad_norm = 1.0  # 0 = no clipping

    c.mesh = mlc.ConfigDict()
    c.mesh.shape = (-1, 1, 1)  # (data, fsdp, tensor); -1 = the remaining devices
    c.mesh.axis_types = "explicit"
    c.mesh.num_devices = 0  # 0 = every device; n = the first n (tests, benchmarks)

    c.train = mlc.ConfigDict()
    c.train.num_steps = 100
    c.train.stop_after_step = 0  # >0: exit after this step (as if killed); resume continues
    c.train.log_every = 1
    c.train.eval_every = 0  # 0 = no periodic eval
    c.train.eval_num_examples = 0  # 0 = the whole held-out split
    c.train.progress_bar = True
    c.train.tensorboard = True

    c.checkpoint = mlc.ConfigDict()
    c.checkpoint.every = 0  # 0 = no checkpoints
    c.checkpoint.keep = 3
    c.checkpoint.async_save = True
    c.checkpoint.allow_config_change = False

    c.distributed = mlc.ConfigDict()
    c.distributed.initialize = "auto"  # auto | always | never
    c.distributed.coordinator_address = ""
    c.distributed.num_processes = 0
    c.distributed.process_id = -1
    return c


def sft_config() -> mlc.ConfigDict:
    """`base_config()` (model, task, rewards, sampling, optim, mesh, checkpoint) + `sft`.

    Here, beside the RL schema, rather than with the SFT trainer: the SFT configs
    import it, and a config file is read before the CLI's checks, so it must not
    import the trainer's libraries."""
    c = base_config()
    c.sft = mlc.ConfigDict()
    c.sft.num_steps = 200
    c.sft.batch_size = 32
    c.sft.num_examples = 0  # train on the first n training records; 0 = all
    c.sft.format_noise = 0.0  # toolcall: share of targets with a broken tag structure
    c.sft.value_noise = 0.0  # share of targets with a wrong argument value / answer
    c.sft.verbose_prob = 0.0  # math: share of targets that restate the problem first
    c.sft.log_every = 10
    c.sft.evaluate = True  # held-out eval at the end (greedy and sampled)
    c.sft.eval_every = 0  # > 0: also every n steps
    c.sft.eval_num_examples = 64
    c.sft.eval_samples = 4  # sampled eval: k per prompt as config.sampling samples
    return c


def _suggest(name: str, choices: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _choice(cfg: mlc.ConfigDict, path: str, choices: tuple[str, ...]) -> None:
    value = _get(cfg, path)
    if value not in choices:
        raise ConfigError(
            f"config.{path}={value!r} is not one of {choices}.{_suggest(str(value), choices)} "
            f"Set --config.{path}=<one of them>."
        )


def _get(cfg: mlc.ConfigDict, path: str) -> Any:
    node: Any = cfg
    for part in path.split("."):
        node = node[part]
    return node


def config_to_dict(cfg: mlc.ConfigDict) -> dict:
    """Plain JSON-able dict (tuples become lists) of a ConfigDict."""
    return json.loads(cfg.to_json())


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _resumable(path: str) -> bool:
    return any(path == f or (f.endswith(".") and path.startswith(f)) for f in RESUMABLE_FIELDS)


def fingerprint(cfg: mlc.ConfigDict | dict) -> str:
    """Hash of the fields that must match for a checkpoint to be resumed."""
    d = cfg if isinstance(cfg, dict) else config_to_dict(cfg)
    items = {k: v for k, v in _flatten(d).items() if not _resumable(k)}
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()[:16]


def config_diff(saved: dict, current: mlc.ConfigDict | dict) -> list[str]:
    """Fields (dotted) whose values differ and that a resume does not allow to differ."""
    cur = current if isinstance(current, dict) else config_to_dict(current)
    a, b = _flatten(saved), _flatten(cur)
    # A field added to base_config after the checkpoint was written is absent
    # from it; the run then used what is now that field's default.
    defaults = _flatten(config_to_dict(base_config()))
    a.update({k: defaults[k] for k in set(b) - set(a) if k in defaults})
    return sorted(k for k in set(a) | set(b) if not _resumable(k) and a.get(k) != b.get(k))
