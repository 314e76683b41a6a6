"""The SFT warm start's config checks (`validate_sft_config`), before any work.

The fields it shares with an RL run are checked with `validate_config`'s own
functions (ranges, model fields, mesh, context length, sampling, reward names), so
a mistake reads the same in both; the `sft` section's own fields are checked here.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections as mlc

from gdpo_jax.data.corrupt import SFT_TASKS
from gdpo_jax.data.tokenizer_registry import tokenizer_known
from gdpo_jax.tasks import check_task_kwargs
from gdpo_jax.train import paths
from gdpo_jax.train.config import (
    DECAY_MASKS,
    SCHEDULES,
    ConfigError,
    _check_rewards,
    _choice,
    check_context_length,
    check_length_limits,
    check_mesh,
    check_mesh_spans_processes,
    check_model_fields,
    import_modules,
)
from gdpo_jax.train.field_checks import Range, check_ranges, check_sampling, check_tiny_model

__all__ = ["SFT_RANGES", "validate_sft_config"]


# The RL sections an SFT config carries (it is base_config() + sft) but SFT never reads:
# the SFT counterpart of a field, where it has one.
_SFT_READS_TRAIN = ("tensorboard", "progress_bar")
_SFT_COUNTERPART = {
    "train.num_steps": "config.sft.num_steps",
    "train.log_every": "config.sft.log_every",
    "train.eval_every": "config.sft.eval_every",
    "eval.num_samples": "config.sft.eval_samples",
}


def check_unread_rl_fields(cfg: mlc.ConfigDict) -> None:
    """A field of `algo`, `eval` or `train` (but train.tensorboard / progress_bar) set
    away from its default: SFT ran on without it (`--config.train.num_steps=1` trained
    sft.num_steps steps, `--config.algo.estimator=grpo` did nothing)."""
    from gdpo_jax.train.schema import base_config

    default = base_config()
    for section in ("algo", "eval", "train"):
        for key, value in cfg[section].items():
            if section == "train" and key in _SFT_READS_TRAIN:
                continue
            if section in default and key in default[section] and value == default[section][key]:
                continue
            name = f"{section}.{key}"
            fix = _SFT_COUNTERPART.get(name)
            raise ConfigError(
                f"config.{name}={value!r} is an RL field that SFT does not read"
                + (f"; set {fix} instead." if fix else "; remove the override.")
            )


def validate_sft_config(cfg: mlc.ConfigDict) -> None:
    """Raises ConfigError naming the first bad field (model / data paths included)."""
    if "sft" not in cfg:  # an RL config: cfg.sft raised a bare AttributeError below
        raise ConfigError(
            "the config has no 'sft' section: it is an RL config (run it with "
            "experiments.train); SFT takes configs/sft_*.py."
        )
    if not cfg.workdir:
        raise ConfigError("config.workdir is empty; pass --config.workdir=/path/to/sft_run.")
    if cfg.task.name not in SFT_TASKS:
        raise ConfigError(
            f"config.task.name={cfg.task.name!r}: SFT targets exist for {SFT_TASKS} only."
        )
    if paths.is_url(cfg.workdir):
        raise ConfigError(
            f"config.workdir={cfg.workdir!r}: SFT exports a Hugging Face directory for the RL "
            "runs to load, which must be local; use a local directory."
        )
    paths.check_workdir(cfg.workdir)  # a file, or a file where a parent would go
    paths.check_inputs(cfg)
    check_task_kwargs(cfg)  # before the model build; load_task would check them after it
    s = cfg.sft
    if s.num_steps < 1 or s.batch_size < 1:
        raise ConfigError(
            f"config.sft.num_steps={s.num_steps} and batch_size={s.batch_size} must be >= 1."
        )
    for f in ("format_noise", "value_noise", "verbose_prob"):
        if not 0.0 <= s[f] <= 1.0:
            raise ConfigError(f"config.sft.{f}={s[f]} must be a probability in [0, 1].")
    # A noise the task's targets do not have validated and did nothing (make_targets).
    unread = {"math": "format_noise", "toolcall": "verbose_prob"}.get(cfg.task.name)
    if unread and s[unread]:
        reads = (
            "value_noise, verbose_prob" if cfg.task.name == "math" else "format_noise, value_noise"
        )
        raise ConfigError(
            f"config.sft.{unread}={s[unread]} has no effect on the {cfg.task.name} task's "
            f"targets (it reads {reads}); set --config.sft.{unread}=0."
        )
    check_unread_rl_fields(cfg)
    # The fields the SFT shares with an RL run, checked as validate_config checks them.
    check_ranges(cfg)
    check_ranges(cfg, SFT_RANGES)
    _choice(cfg, "optim.schedule", SCHEDULES)
    _choice(cfg, "optim.decay_mask", DECAY_MASKS)
    check_tiny_model(cfg)
    check_sampling(cfg)
    if not cfg.model.name and not tokenizer_known(cfg.model.tokenizer):
        raise ConfigError(
            f"config.model.tokenizer={cfg.model.tokenizer!r} is neither a registered tokenizer "
            "nor a tokenizer directory (tokenizer.json, ...); a random-init model "
            "(config.model.name='') needs one."
        )
    # As validate_config checks them: each used to fail after the build (dtype, attention,
    # axis types), after all training (an unknown reward, at the evaluation), or to run on
    # past the model's positions or with more devices than exist.
    check_model_fields(cfg)
    check_mesh_spans_processes(cfg, check_mesh(cfg, jax.device_count()))
    if cfg.sampling.max_new_tokens < 1 or cfg.sampling.max_prompt_len < 1:
        raise ConfigError("config.sampling.max_new_tokens and max_prompt_len must be >= 1.")
    check_context_length(cfg)
    names = tuple(cfg.rewards.names)
    if s.evaluate or s.eval_every:
        import_modules(cfg)
        _check_rewards(cfg, names, None)
        check_length_limits(cfg)


# The sft section's counts (the shared fields: field_checks.RANGES).
SFT_RANGES = (
    Range("sft.num_examples", low=0, integer=True, note="0 = all", example="0"),
    Range("sft.log_every", low=1, integer=True, example="10"),
    Range("sft.eval_every", low=0, integer=True, note="0 = at the end only", example="0"),
    Range("sft.eval_num_examples", low=0, integer=True, example="64"),
    Range("sft.eval_samples", low=1, integer=True, example="4"),
)


def training_records(cfg: mlc.ConfigDict, task: Any) -> list[dict]:
    """The task's records SFT trains on (`sft.num_examples`); a ConfigError when it asks
    for more than the task has (it trained on fewer, without a word) or evaluates with
    no held-out records (evaluate() crashed after all the training, before the export)."""
    s = cfg.sft
    if s.num_examples > len(task.train):
        raise ConfigError(
            f"config.sft.num_examples={s.num_examples}, but the task has "
            f"{len(task.train)} training records; use at most that many, or 0 (all)."
        )
    if (s.evaluate or s.eval_every) and not task.eval:
        raise ConfigError(
            "the task has no held-out records for SFT's eval (config.sft.evaluate / "
            "eval_every): set config.task.num_eval (synthetic data) or "
            "config.task.eval_source, or --config.sft.evaluate=False "
            "--config.sft.eval_every=0."
        )
    return task.train[: s.num_examples or None]


def sft_targets(cfg: mlc.ConfigDict, train: list[dict]) -> list[str]:
    """Each record's SFT target text (`data.corrupt.make_targets` with the config's
    noise); a record that cannot give its target is a ConfigError (it was a traceback
    after the model build)."""
    from gdpo_jax.data.corrupt import make_targets

    s = cfg.sft
    try:
        return make_targets(
            train,
            cfg.task.name,
            seed=cfg.seed,
            format_noise=s.format_noise,
            value_noise=s.value_noise,
            verbose_prob=s.verbose_prob,
        )
    except ValueError as e:
        raise ConfigError(f"SFT targets of {cfg.task.name!r}: {e}") from e
