"""The run configuration: validation (`validate_config`) before any work starts.

The schema (`base_config`) and the resume fingerprint live in
`gdpo_jax.train.schema`, the reward wiring (`reward_specs`, `reward_runner`) in
`gdpo_jax.train.reward_setup`; both are re-exported here, the public home of
the config API. Every error is a ConfigError naming the field and the fix.
"""

from __future__ import annotations

import copy
import json
import numbers
import os
from collections import Counter

import ml_collections as mlc

from gdpo_jax.errors import ConfigError
from gdpo_jax.train.field_checks import (  # noqa: F401 - public names, re-exported
    check_distributed,
    check_model_fields,
    check_ranges,
    check_sampling,
    check_tiny_model,
    eval_params,
    sampling_params,
)
from gdpo_jax.train.reward_setup import (  # noqa: F401 - public names, re-exported
    _check_reward_kwargs,
    _check_reward_lists,
    _check_rewards,
    check_length_limits,
    import_modules,
    reward_runner,
    reward_specs,
    task_eval_kwargs,
)
from gdpo_jax.train.schema import (  # noqa: F401 - public names, re-exported
    RESUMABLE_FIELDS,
    _choice,
    _flatten,
    _get,
    _resumable,
    _suggest,
    base_config,
    config_diff,
    config_to_dict,
    fingerprint,
)

SCHEDULES = ("cosine", "constant", "linear")
# optim.decay_mask (train/state.py:decay_mask)
DECAY_MASKS = ("all", "no_bias_norm")
_OLD_LOGPROBS = ("sampler", "recompute")
_ON_ERROR = ("raise", "nan")


def _estimators() -> tuple[str, ...]:
    from gdpo_jax.core.advantages import ESTIMATORS

    return tuple(ESTIMATORS)


def _losses() -> tuple[tuple[str, ...], tuple[str, ...]]:
    from gdpo_jax.core.losses import AGGREGATIONS, KL_ESTIMATORS

    return tuple(AGGREGATIONS), tuple(KL_ESTIMATORS)


def _divisor(n: int, near: int) -> int:
    """The largest divisor of n that is <= near (at least 1)."""
    return max(d for d in range(1, max(min(n, near), 1) + 1) if n % d == 0)


def prompt_buckets(cfg: mlc.ConfigDict) -> tuple[int, ...]:
    """The run's prompt widths (config.sampling.prompt_buckets, () = automatic).

    Raises ConfigError unless they ascend strictly and end at max_prompt_len.
    """
    from gdpo_jax.sampling.params import default_prompt_buckets

    s = cfg.sampling
    raw = tuple(s.get("prompt_buckets", ()))
    if not raw:
        return default_prompt_buckets(s.max_prompt_len)
    # Widths are whole tokens: int() truncated (4.5, 8) to (4, 8) without a word.
    whole = all(isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in raw)
    given = tuple(int(b) for b in raw) if whole else raw
    if (
        not whole
        or any(b >= c for b, c in zip(given, given[1:]))
        or given[0] < 1
        or given[-1] != s.max_prompt_len
    ):
        raise ConfigError(
            f"config.sampling.prompt_buckets={given} must be whole numbers of tokens, ascend "
            "strictly from >= 1 and end at "
            f"sampling.max_prompt_len={s.max_prompt_len}, e.g. "
            f"--config.sampling.prompt_buckets='({s.max_prompt_len // 2}, {s.max_prompt_len})'."
        )
    return given


def validated_copy(cfg: mlc.ConfigDict, workdir: str) -> mlc.ConfigDict:
    """A validated copy of `cfg` for a tool that writes no run (tuner, plan check):
    `workdir` stands in for an empty config.workdir, which validation requires."""
    cfg = copy.deepcopy(cfg)
    with cfg.unlocked():
        cfg.workdir = cfg.workdir or workdir
    validate_config(cfg)
    return cfg


def validate_config(
    cfg: mlc.ConfigDict,
    *,
    num_devices: int | None = None,
    num_processes: int | None = None,
    known_rewards: list[str] | tuple[str, ...] | None = None,
) -> None:
    """Raises ConfigError (naming the field and the fix) on the first bad field.

    num_devices: global device count used to check batch divisibility (default
      jax.device_count()). num_processes: the run's JAX processes (default
      jax.process_count() on a live run; a planner passes its target's host count,
      1 when not given with num_devices). known_rewards: registered reward names
      (default gdpo_jax.rewards.list_rewards()).
    """

    if "sft" in cfg:  # the RL run never read it: a warm-start config ran as RL
        raise ConfigError(
            "the config has an 'sft' section: it is an SFT warm-start config (run it with "
            "experiments.sft); experiments.train takes an RL config."
        )
    a = cfg.algo
    if not cfg.workdir:
        raise ConfigError("config.workdir is empty; pass --config.workdir=/path/to/run.")
    from gdpo_jax.train import paths

    paths.check_workdir(cfg.workdir)  # gs:// etc. need their filesystem package
    _choice(cfg, "algo.estimator", _estimators())
    aggregations, kl_estimators = _losses()
    _choice(cfg, "algo.aggregation", aggregations)
    _choice(cfg, "algo.kl_estimator", kl_estimators)
    _choice(cfg, "algo.kl_in_reward_estimator", kl_estimators)
    _choice(cfg, "algo.batch_norm", ("sample", "token"))
    _choice(cfg, "algo.nan_rewards", ("omit", "zero"))
    _choice(cfg, "algo.old_logprobs", _OLD_LOGPROBS)
    _choice(cfg, "optim.schedule", SCHEDULES)
    _choice(cfg, "optim.decay_mask", DECAY_MASKS)
    _choice(cfg, "rewards.on_error", _ON_ERROR)
    check_model_fields(cfg)
    _choice(cfg, "rewards.executor", ("thread", "process"))
    if a.group_size < 2:
        raise ConfigError(
            f"config.algo.group_size={a.group_size}: group-relative advantages need at least 2 "
            "generations per prompt; set --config.algo.group_size=2 or more."
        )
    if a.num_prompts < 1:
        raise ConfigError(f"config.algo.num_prompts={a.num_prompts}; must be >= 1.")
    check_ranges(cfg)
    if a.dual_clip != 0 and not a.dual_clip > 1.0:  # NaN fails too
        raise ConfigError(
            f"config.algo.dual_clip={a.dual_clip} must be > 1 (or 0 = off); e.g. "
            "--config.algo.dual_clip=3.0."
        )
    if cfg.eval.greedy and cfg.eval.num_samples > 1:
        # k copies of one greedy completion: k times the eval's compute, a pass@k of 1.
        raise ConfigError(
            f"config.eval.num_samples={cfg.eval.num_samples} with eval.greedy=True repeats one "
            "completion; set --config.eval.greedy=False to sample them, or num_samples=1."
        )
    check_distributed(cfg)
    check_tiny_model(cfg)
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
    from gdpo_jax.tasks import check_task_kwargs, list_tasks

    try:
        tasks = list_tasks()  # also registers the toy task's rewards and tokenizer
    except ImportError as e:
        raise ConfigError(f"config.task.name: {e}") from e
    if not cfg.model.name and not tokenizer_registry.tokenizer_known(cfg.model.tokenizer):
        raise ConfigError(
            f"config.model.tokenizer={cfg.model.tokenizer!r} is neither a registered tokenizer "
            f"({tokenizer_registry.list_tokenizers()}) nor a tokenizer directory; a "
            "random-init model (config.model.name='') needs one: set --config.model.tokenizer."
        )
    if cfg.task.name not in tasks:
        raise ConfigError(
            f"config.task.name={cfg.task.name!r} is not a registered task."
            f"{_suggest(cfg.task.name, tasks)} Known: {tasks}."
        )
    if cfg.task.source == "synthetic" and cfg.task.num_train < 1:
        raise ConfigError(
            f"config.task.num_train={cfg.task.num_train}: a synthetic source generates that "
            "many training records; set it to 1 or more (0 = all applies to a file source)."
        )
    check_task_kwargs(cfg)  # the task's kwargs table: unknown keys, types, ranges
    _check_rewards(cfg, names, known_rewards)
    for e in tuple(cfg.rewards.get("executors", ())):
        if e not in ("", "thread", "process"):
            raise ConfigError(
                f"config.rewards.executors: {e!r} is not one of '', 'thread', 'process'."
            )
    _check_reward_lists(cfg, names)
    for key in cfg.rewards.kwargs.keys():
        if key not in names:
            raise ConfigError(
                f"config.rewards.kwargs has keys for {key!r}, which is not in "
                f"config.rewards.names={names}."
            )
        _check_reward_kwargs(cfg, key)
    check_length_limits(cfg)

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
    if slots < 0:
        raise ConfigError(
            f"config.sampling.continuous_slots={slots} must be >= 1 (decode slots per batch "
            "shard) or 0 (static calls); e.g. --config.sampling.continuous_slots=0."
        )
    pslots = int(cfg.sampling.get("continuous_prompt_slots", 0))
    if pslots < 0:
        raise ConfigError(
            f"config.sampling.continuous_prompt_slots={pslots} must be >= 1 (shared prompt "
            "slots per batch shard) or 0 (a prompt copy per lane); e.g. "
            "--config.sampling.continuous_prompt_slots=0."
        )
    if pslots and not (slots and cfg.sampling.get("share_prompt_cache", True)):
        raise ConfigError(
            f"config.sampling.continuous_prompt_slots={pslots} shares prompts among continuous "
            f"batching's lanes: it needs sampling.continuous_slots >= 1 (is {slots}) and "
            "sampling.share_prompt_cache=True; set --config.sampling.continuous_prompt_slots=0."
        )
    from gdpo_jax.sampling.params import DECODE_LAYERS

    layers = cfg.sampling.get("decode_layers", "auto")
    if layers not in ("auto", *DECODE_LAYERS):
        raise ConfigError(
            f"config.sampling.decode_layers={layers!r} must be one of "
            f"{('auto', *DECODE_LAYERS)}; e.g. --config.sampling.decode_layers=auto."
        )
    from gdpo_jax.sampling.params import DECODE_GROWTH

    growth = cfg.sampling.get("decode_growth", "auto")
    if growth not in ("auto", *DECODE_GROWTH):
        raise ConfigError(
            f"config.sampling.decode_growth={growth!r} must be one of "
            f"{('auto', *DECODE_GROWTH)}; e.g. --config.sampling.decode_growth=auto."
        )
    phases = int(cfg.sampling.get("decode_phases", 0))
    if phases < 0:
        raise ConfigError(
            f"config.sampling.decode_phases={phases} must be an int >= 1 (decode "
            "phases) or 0 (auto); e.g. --config.sampling.decode_phases=0."
        )
    if not cfg.sampling.temperature > 0:  # NaN fails too
        raise ConfigError(
            f"config.sampling.temperature={cfg.sampling.temperature} must be > 0 for RL "
            "(the loss uses the tempered log-probs)."
        )
    check_sampling(cfg)

    live = num_devices is None  # this process's devices, not a planned target's
    if live:
        import jax

        num_devices = jax.device_count()
        num_processes = jax.process_count() if num_processes is None else num_processes
    procs = num_processes or 1
    if a.num_prompts % procs:
        raise ConfigError(
            f"config.algo.num_prompts={a.num_prompts} does not split over "
            f"{procs} processes (each samples its own prompts); use a multiple."
        )
    prompts_per_call(cfg, procs)
    shape = check_mesh(cfg, num_devices)
    check_mesh_spans_processes(cfg, shape, processes=procs, live=live)
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


def check_mesh(cfg: mlc.ConfigDict, num_devices: int) -> tuple[int, ...]:
    """config.mesh against `num_devices` devices (RL and SFT): the resolved shape."""
    from gdpo_jax.train import mesh as mesh_lib

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
    return shape


def prompts_per_call(cfg: mlc.ConfigDict, processes: int) -> int:
    """Each process's prompts per sampler call (0: one call), every process making the
    same calls; a ConfigError when `sampling.rows_per_call` does not split over them."""
    rpc = int(cfg.sampling.get("rows_per_call", 0))
    if not rpc:
        return 0
    group, local = cfg.algo.group_size, cfg.algo.num_prompts // processes
    per_call = rpc // group // processes
    if per_call < 1 or local % per_call:
        raise ConfigError(
            f"config.sampling.rows_per_call={rpc} gives {rpc // group} prompts per call, "
            f"which does not split evenly over {processes} processes of {local} prompts "
            f"each; use a multiple of {group * processes} that divides "
            f"{cfg.algo.num_prompts * group}."
        )
    return per_call


def check_mesh_spans_processes(
    cfg: mlc.ConfigDict, shape: tuple[int, ...], *, processes: int | None = None, live: bool = True
) -> None:
    """With several processes, the mesh (resolved `shape`, (data, fsdp, tensor)) must give
    every process an equal share of its devices and of its batch rows.

    processes: the run's process count (default jax.process_count()); live: check the
    devices' owners too (False for a planned target, whose devices are not this host's).

    A process left out of the mesh built the model, then failed alone in the first
    rollout while the others waited in the sampler's collective, for ever. Batch axes
    (data x fsdp) that do not divide by the process count (a "tensor" axis across the
    processes) left no row block per process: the sampler refused it only after the
    model was built.
    """
    import jax

    n = cfg.mesh.num_devices
    procs = jax.process_count() if processes is None else processes
    if procs == 1:
        return
    if n and live:
        owners = Counter(d.process_index for d in jax.devices()[:n])
        if len(owners) != procs or len(set(owners.values())) != 1:
            raise ConfigError(
                f"config.mesh.num_devices={n} gives the {procs} processes unequal "
                f"shares of the mesh (devices per process: {dict(sorted(owners.items()))}); "
                "every process runs its share of each step: use 0 (all devices)."
            )
    shards = shape[0] * shape[1]
    if shards % procs:
        raise ConfigError(
            f"config.mesh.shape={tuple(cfg.mesh.shape)} resolves to {shape}: its batch axes "
            f"data x fsdp = {shards} do not split over the {procs} processes (each samples "
            f"and feeds its own rows); put the processes along data/fsdp, e.g. "
            "--config.mesh.shape='(-1, 1, 1)'."
        )


def _model_max_positions(cfg: mlc.ConfigDict) -> int | None:
    """Context length of the configured model (`ModelConfig.context_length`), read
    without loading weights.

    None when it cannot be known before loading (a registered GGUF name); the
    Trainer checks again once the model is built.
    """
    from gdpo_jax.models.config import ModelConfig, hf_context_length, hf_max_positions

    name = cfg.model.name
    if not name:
        tiny = cfg.model.tiny.to_dict()
        try:
            return ModelConfig.tiny(**tiny).context_length
        except (TypeError, ValueError):  # check_tiny_model names what is wrong
            return int(
                tiny.get("max_position_embeddings", ModelConfig.tiny().max_position_embeddings)
            )
    path = os.path.join(name, "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:  # as the model will read it (its type's default if left out)
        config = json.load(f)
    try:
        return hf_context_length(config)
    except ValueError:  # the build names the bad rope setting; the positions alone count
        return hf_max_positions(config)


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
            f"{s.max_prompt_len + s.max_new_tokens} exceeds the model's context of "
            f"{max_positions} positions (max_position_embeddings, times a linear / yarn "
            "rope_scaling factor); lower one of them."
        )
