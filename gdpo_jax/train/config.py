"""The run configuration: schema (`base_config`), validation, fingerprint.

Every experiment config (configs/*.py) starts from `base_config()` and
overrides fields, so the command line can override any of them with
`--config.a.b=value` (absl `config_flags`, locked: a typo is an error).
"Off" is spelled 0 / "" rather than None, so that every field has a type the
command line can parse.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
from typing import Any

import ml_collections as mlc

from gdpo_jax.errors import ConfigError  # noqa: F401 - re-exported: public name

# Fields that may change between a checkpoint and the run resuming from it:
# they do not change what a step computes, only how long / how often.
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
    # Memory, not maths: lowered to fit a decode after an OOM (changes later rollouts' keys).
    "sampling.rows_per_call",
    # How rewards are computed, not what they are.
    "rewards.num_workers",
    "rewards.executor",
    "rewards.executors",
    "rewards.chunk_size",
    "rewards.overlap",
    "rewards.sandbox.",
)
_SCHEDULES = ("cosine", "constant", "linear")
_OLD_LOGPROBS = ("sampler", "recompute")
_ON_ERROR = ("raise", "nan")


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
    c.model.remat = False
    # Multi-token attention kernel: auto (cuDNN flash on GPU in bf16/f16, else xla) |
    # xla (einsum path) | dpa (jax.nn.dot_product_attention, XLA) | cudnn.
    c.model.attention = "auto"

    c.task = mlc.ConfigDict()
    c.task.name = "toolcall"  # toolcall | math | code | arithmetic
    c.task.source = "synthetic"  # "synthetic" or a file / glob / directory the task loader reads
    c.task.eval_source = ""  # held-out data; "" = split "test" of a `source` dir (file: no eval)
    c.task.seed = 0  # synthetic data seed (independent of the run's seed)
    c.task.num_train = 2048  # synthetic only
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
    c.algo.group_size = 4  # G generations per prompt
    c.algo.num_prompts = 8  # prompts per rollout batch (global, all hosts)
    c.algo.clip_low = 0.2
    c.algo.clip_high = 0.2
    c.algo.dual_clip = 0.0  # 0 = off; verl's clip_ratio_c (e.g. 3.0)
    c.algo.beta = 0.0  # KL-in-loss coefficient; 0 skips the reference model entirely
    c.algo.kl_estimator = "k3"  # k1 | k3 | mse
    # KL coefficient in the reward (paper's tool calling GRPO: 0.001): a per-sequence
    # penalty -coef * KL added after GDPO's per-reward normalization (not a reward column).
    c.algo.kl_in_reward = 0.0
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
    # > 0: continuous batching with this many decode slots per sampler call (a row
    # that finishes hands its slot to a waiting row); single device only. Greedy
    # rows equal the static decode's; sampled rows use a per-row key stream.
    c.sampling.continuous_slots = 0

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


def _estimators() -> tuple[str, ...]:
    from gdpo_jax.core.advantages import ESTIMATORS

    return tuple(ESTIMATORS)


def _losses() -> tuple[tuple[str, ...], tuple[str, ...]]:
    from gdpo_jax.core.losses import AGGREGATIONS, KL_ESTIMATORS

    return tuple(AGGREGATIONS), tuple(KL_ESTIMATORS)


def _divisor(n: int, near: int) -> int:
    """The largest divisor of n that is <= near (at least 1)."""
    return max(d for d in range(1, max(min(n, near), 1) + 1) if n % d == 0)


def import_modules(cfg: mlc.ConfigDict) -> None:
    """Imports config.imports (custom rewards, tasks, tokenizers register on import)."""
    import importlib

    mods = cfg.get("imports", ())
    if isinstance(mods, str) or not all(isinstance(m, str) and m for m in mods):
        raise ConfigError(
            f"config.imports={mods!r} must be a tuple of module names, e.g. "
            "--config.imports='(\"my_pkg.rewards\",)'."
        )
    for m in mods:
        try:
            importlib.import_module(m)
        except Exception as e:
            raise ConfigError(
                f"config.imports: importing {m!r} failed ({type(e).__name__}: {e}); "
                "is it installed or on PYTHONPATH?"
            ) from e


def _check_rewards(cfg: mlc.ConfigDict, names: tuple, known: list | tuple | None) -> None:
    """Reward names resolve (registered, or an import path) and the sandbox is usable."""
    from gdpo_jax.rewards import get_reward, list_rewards
    from gdpo_jax.rewards.registry import _REGISTRY

    fns = {}
    for n in names:
        if known is not None and n in known:  # the caller vouches for it
            fns[n] = _REGISTRY.get(n)
            continue
        try:
            fns[n] = get_reward(n)
        except ImportError as e:
            raise ConfigError(f"config.rewards.names: {e}") from e
        except KeyError:
            try:
                known = list(known if known is not None else list_rewards())
            except ImportError as e:
                raise ConfigError(f"config.rewards.names: {e}") from e
            raise ConfigError(
                f"config.rewards.names: unknown reward {n!r}.{_suggest(n, tuple(known))} "
                f"Registered rewards: {sorted(known)}; or name one by import path "
                "'pkg.module:function' (or list its module in config.imports)."
            ) from None
    sb = cfg.rewards.get("sandbox", None)
    if sb is not None and any(getattr(f, "uses_sandbox", False) for f in fns.values()):
        from gdpo_jax.rewards import sandbox

        _choice(cfg, "rewards.sandbox.isolation", ("auto",) + sandbox.MODES)
        try:
            sandbox.isolation(sb.isolation, bool(sb.allow_weak))
        except RuntimeError as e:
            raise ConfigError(f"config.rewards.sandbox: {e}") from None


def prompt_buckets(cfg: mlc.ConfigDict) -> tuple[int, ...]:
    """The run's prompt widths (config.sampling.prompt_buckets, () = automatic).

    Raises ConfigError unless they ascend strictly and end at max_prompt_len.
    """
    from gdpo_jax.sampling.sampler import default_prompt_buckets

    s = cfg.sampling
    given = tuple(int(b) for b in s.get("prompt_buckets", ()))
    if not given:
        return default_prompt_buckets(s.max_prompt_len)
    if (
        any(b >= c for b, c in zip(given, given[1:]))
        or given[0] < 1
        or given[-1] != s.max_prompt_len
    ):
        raise ConfigError(
            f"config.sampling.prompt_buckets={given} must ascend strictly from >= 1 and end at "
            f"sampling.max_prompt_len={s.max_prompt_len}, e.g. "
            f"--config.sampling.prompt_buckets='({s.max_prompt_len // 2}, {s.max_prompt_len})'."
        )
    return given


def validate_config(
    cfg: mlc.ConfigDict,
    *,
    num_devices: int | None = None,
    known_rewards: list[str] | tuple[str, ...] | None = None,
) -> None:
    """Raises ConfigError (naming the field and the fix) on the first bad field.

    num_devices: global device count used to check batch divisibility (default
      jax.device_count()). known_rewards: registered reward names (default
      gdpo_jax.rewards.list_rewards()).
    """
    from gdpo_jax.train import mesh as mesh_lib

    a = cfg.algo
    if not cfg.workdir:
        raise ConfigError("config.workdir is empty; pass --config.workdir=/path/to/run.")
    from gdpo_jax.train import paths

    paths.check_workdir(cfg.workdir)  # gs:// etc. need their filesystem package
    _choice(cfg, "algo.estimator", _estimators())
    aggregations, kl_estimators = _losses()
    _choice(cfg, "algo.aggregation", aggregations)
    _choice(cfg, "algo.kl_estimator", kl_estimators)
    _choice(cfg, "algo.batch_norm", ("sample", "token"))
    _choice(cfg, "algo.old_logprobs", _OLD_LOGPROBS)
    _choice(cfg, "optim.schedule", _SCHEDULES)
    _choice(cfg, "rewards.on_error", _ON_ERROR)
    _choice(cfg, "model.attention", ("auto", "xla", "dpa", "cudnn"))
    if cfg.model.attention == "cudnn":
        import jax

        if jax.default_backend() != "gpu" or cfg.model.dtype not in ("bfloat16", "float16"):
            raise ConfigError(
                f"config.model.attention='cudnn' needs a GPU and model.dtype bfloat16/float16 "
                f"(backend {jax.default_backend()!r}, dtype {cfg.model.dtype!r}); set "
                "--config.model.attention=auto."
            )
    _choice(cfg, "rewards.executor", ("thread", "process"))
    _choice(cfg, "distributed.initialize", ("auto", "always", "never"))
    if a.group_size < 2:
        raise ConfigError(
            f"config.algo.group_size={a.group_size}: group-relative advantages need at least 2 "
            "generations per prompt; set --config.algo.group_size=2 or more."
        )
    if a.num_prompts < 1:
        raise ConfigError(f"config.algo.num_prompts={a.num_prompts}; must be >= 1.")
    for field in ("clip_low", "clip_high", "beta", "kl_in_reward", "entropy_coef", "eps"):
        if a[field] < 0:
            raise ConfigError(f"config.algo.{field}={a[field]} must be >= 0.")
    if a.dual_clip and a.dual_clip <= 1.0:
        raise ConfigError(f"config.algo.dual_clip={a.dual_clip} must be > 1 (or 0 = off).")
    for field in ("num_minibatches", "num_epochs", "num_microbatches"):
        if a[field] < 1:
            raise ConfigError(f"config.algo.{field}={a[field]} must be >= 1.")

    names = tuple(cfg.rewards.names)
    if not names:
        raise ConfigError("config.rewards.names is empty; name at least one reward function.")
    if len(set(names)) != len(names):
        raise ConfigError(f"config.rewards.names={names} lists a reward twice.")
    import_modules(cfg)
    from gdpo_jax.data import tokenizer_registry
    from gdpo_jax.tasks import list_tasks

    try:
        tasks = list_tasks()  # also registers the toy task's rewards and tokenizer
    except ImportError as e:
        raise ConfigError(f"config.task.name: {e}") from e
    if not cfg.model.name and not tokenizer_registry.tokenizer_known(cfg.model.tokenizer):
        raise ConfigError(
            f"config.model.tokenizer={cfg.model.tokenizer!r} is neither a registered tokenizer "
            f"({tokenizer_registry.list_tokenizers()}) nor a directory; a random-init model "
            "(config.model.name='') needs one: set --config.model.tokenizer."
        )
    if cfg.task.name not in tasks:
        raise ConfigError(
            f"config.task.name={cfg.task.name!r} is not a registered task."
            f"{_suggest(cfg.task.name, tasks)} Known: {tasks}."
        )
    _check_rewards(cfg, names, known_rewards)
    for e in tuple(cfg.rewards.get("executors", ())):
        if e not in ("", "thread", "process"):
            raise ConfigError(
                f"config.rewards.executors: {e!r} is not one of '', 'thread', 'process'."
            )
    if int(cfg.rewards.get("chunk_size", 0)) < 0:
        raise ConfigError(
            f"config.rewards.chunk_size={cfg.rewards.chunk_size} must be >= 0 "
            "(0 = split the rows evenly over the workers)."
        )
    for field in ("weights", "conditions", "thresholds", "executors"):
        value = tuple(cfg.rewards.get(field, ()))
        if value and len(value) != len(names):
            raise ConfigError(
                f"config.rewards.{field} has {len(value)} entries but config.rewards.names has "
                f"{len(names)} ({names}); give one per reward, or () for the default."
            )
    for i, w in enumerate(tuple(cfg.rewards.weights)):
        if not math.isfinite(float(w)):
            raise ConfigError(
                f"config.rewards.weights[{i}]={w} is not finite; pass finite reward weights."
            )
    for n, cond in zip(names, tuple(cfg.rewards.conditions)):
        if cond and cond not in names:
            raise ConfigError(
                f"config.rewards.conditions: reward {n!r} is conditioned on {cond!r}, which is "
                f"not in config.rewards.names={names}."
            )
        if cond == n:
            raise ConfigError(f"config.rewards.conditions: reward {n!r} conditioned on itself.")
    for key in cfg.rewards.kwargs.keys():
        if key not in names:
            raise ConfigError(
                f"config.rewards.kwargs has keys for {key!r}, which is not in "
                f"config.rewards.names={names}."
            )
        _check_reward_kwargs(cfg, key)

    if cfg.sampling.max_new_tokens < 1 or cfg.sampling.max_prompt_len < 1:
        raise ConfigError("config.sampling.max_new_tokens and max_prompt_len must be >= 1.")
    check_context_length(cfg)
    prompt_buckets(cfg)
    rpc = int(cfg.sampling.get("rows_per_call", 0))
    if rpc < 0 or (rpc and (rpc % a.group_size or a.num_prompts % (rpc // a.group_size))):
        example = a.group_size * _divisor(a.num_prompts, max(rpc // a.group_size, 1))
        raise ConfigError(
            f"config.sampling.rows_per_call={rpc} must be 0 (one call) or a multiple of "
            f"algo.group_size={a.group_size} whose prompt count divides algo.num_prompts="
            f"{a.num_prompts}, e.g. --config.sampling.rows_per_call={example}."
        )
    slots = int(cfg.sampling.get("continuous_slots", 0))
    if cfg.mesh.num_devices or num_devices is not None:
        n_dev = cfg.mesh.num_devices or num_devices
    else:
        import jax

        n_dev = jax.device_count()
    if slots < 0 or (slots and n_dev != 1):
        raise ConfigError(
            f"config.sampling.continuous_slots={slots} needs a single device (mesh of "
            f"{n_dev}); set --config.mesh.num_devices=1 or --config.sampling.continuous_slots=0."
        )
    if cfg.sampling.temperature <= 0:
        raise ConfigError(
            f"config.sampling.temperature={cfg.sampling.temperature} must be > 0 for RL "
            "(the loss uses the tempered log-probs)."
        )
    if cfg.optim.lr <= 0:
        raise ConfigError(f"config.optim.lr={cfg.optim.lr} must be > 0.")
    if cfg.train.num_steps < 1:
        raise ConfigError(f"config.train.num_steps={cfg.train.num_steps} must be >= 1.")

    if num_devices is None:
        import jax

        num_devices = jax.device_count()
        if a.num_prompts % jax.process_count():
            raise ConfigError(
                f"config.algo.num_prompts={a.num_prompts} does not split over "
                f"{jax.process_count()} processes (each samples its own prompts); use a multiple."
            )
    if cfg.mesh.num_devices:
        if not 0 < cfg.mesh.num_devices <= num_devices:
            raise ConfigError(
                f"config.mesh.num_devices={cfg.mesh.num_devices} but "
                f"{num_devices} devices exist; use 0 (all) or fewer."
            )
        num_devices = cfg.mesh.num_devices
    try:
        shape = mesh_lib.resolve_mesh_shape(tuple(cfg.mesh.shape), num_devices)
    except ValueError as e:
        raise ConfigError(f"config.{e}") from None
    _choice(cfg, "mesh.axis_types", tuple(mesh_lib.AXIS_TYPES))
    shards = shape[0] * shape[1]
    rows = a.num_prompts * a.group_size
    per_update = a.num_minibatches * a.num_microbatches
    if rows % per_update:
        raise ConfigError(
            f"config.algo: the rollout batch of num_prompts*group_size = {rows} rows does not "
            f"split into num_minibatches*num_microbatches = {per_update} equal micro-batches; "
            "change one of them."
        )
    micro = rows // per_update
    if micro % shards:
        raise ConfigError(
            f"config.algo: a micro-batch has {micro} rows (num_prompts*group_size / "
            f"(num_minibatches*num_microbatches)), not divisible by the mesh's batch axes "
            f"data x fsdp = {shards} (mesh.shape={shape}); raise config.algo.num_prompts or "
            "lower num_microbatches / num_minibatches, or change config.mesh.shape."
        )


def _model_max_positions(cfg: mlc.ConfigDict) -> int | None:
    """max_position_embeddings of the configured model, read without loading weights.

    None when it cannot be known before loading (a registered GGUF name); the
    Trainer checks again once the model is built.
    """
    from gdpo_jax.models.config import ModelConfig

    name = cfg.model.name
    if not name:
        tiny = cfg.model.tiny.to_dict()
        return int(tiny.get("max_position_embeddings", ModelConfig.tiny().max_position_embeddings))
    path = os.path.join(name, "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        # Same default as ModelConfig.from_hf.
        return int(json.load(f).get("max_position_embeddings", 2048))


def check_context_length(cfg: mlc.ConfigDict, max_positions: int | None = None) -> None:
    """Prompt + completion must fit the model's position table.

    Beyond it RoPE extrapolates to positions the model never saw (and a learned
    position table would index out of range): generation runs but is garbage.
    """
    if max_positions is None:
        max_positions = _model_max_positions(cfg)
    s = cfg.sampling
    if max_positions is not None and s.max_prompt_len + s.max_new_tokens > max_positions:
        raise ConfigError(
            f"config.sampling.max_prompt_len={s.max_prompt_len} + "
            f"config.sampling.max_new_tokens={s.max_new_tokens} = "
            f"{s.max_prompt_len + s.max_new_tokens} exceeds the model's "
            f"max_position_embeddings={max_positions}; lower one of them."
        )


def _check_reward_kwargs(cfg: mlc.ConfigDict, name: str) -> None:
    """A misspelled reward kwarg would be accepted and silently ignored by **kwargs."""
    from gdpo_jax.rewards.registry import check_reward_kwargs

    kw = cfg.rewards.kwargs[name]
    kw = kw.to_dict() if isinstance(kw, mlc.ConfigDict) else dict(kw)
    try:
        check_reward_kwargs(name, kw)
    except KeyError:  # not registered here (validated with an explicit known_rewards)
        return
    except ValueError as e:
        raise ConfigError(f"config.rewards.kwargs.{name}: {e}.") from None


def reward_specs(cfg: mlc.ConfigDict) -> list:
    """The config's rewards as gdpo_jax.rewards.RewardSpec objects."""
    from gdpo_jax.rewards import RewardSpec, get_reward

    names = tuple(cfg.rewards.names)
    weights = tuple(cfg.rewards.weights) or (1.0,) * len(names)
    conditions = tuple(cfg.rewards.conditions) or ("",) * len(names)
    thresholds = tuple(cfg.rewards.thresholds) or (1.0,) * len(names)
    kwargs = cfg.rewards.kwargs.to_dict()
    executors = tuple(cfg.rewards.get("executors", ())) or ("",) * len(names)
    sb = cfg.rewards.get("sandbox", None)
    sandbox_kw = {"isolation": sb.isolation, "allow_weak": bool(sb.allow_weak)} if sb else {}

    def kw(n: str) -> dict:
        # The sandbox settings reach the rewards that run it; the reward's own
        # kwargs (config.rewards.kwargs) win.
        try:
            uses = bool(sandbox_kw) and getattr(get_reward(n), "uses_sandbox", False)
        except (KeyError, ImportError):  # the RewardRunner reports these, by name
            uses = False
        return {**(sandbox_kw if uses else {}), **kwargs.get(n, {})}

    return [
        RewardSpec(
            name=n,
            weight=float(w),
            condition=c or None,
            threshold=float(t),
            kwargs=kw(n),
            executor=e or None,
        )
        for n, w, c, t, e in zip(names, weights, conditions, thresholds, executors)
    ]


def reward_runner(cfg: mlc.ConfigDict, specs: list | None = None):
    """The config's gdpo_jax.rewards.RewardRunner (pools, deadline, error policy)."""
    from gdpo_jax.rewards import RewardRunner

    r = cfg.rewards
    return RewardRunner(
        specs if specs is not None else reward_specs(cfg),
        num_workers=r.num_workers,
        timeout_s=r.timeout_s,
        on_error=r.on_error,
        executor=r.get("executor", "thread"),
        chunk_size=int(r.get("chunk_size", 0)) or None,
        imports=tuple(cfg.get("imports", ())),
    )


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
