"""Checks of single config fields and small groups of them, before any work starts.

One table (`RANGES`) gives each numeric field's type, its bounds and what its
special values mean. A value outside them ran before, then failed deep inside a
jitted step, the optimizer or the reward runner (or quietly did something else:
a negative `optim.min_lr_ratio` ends the schedule at a negative learning rate).
NaN fails every bound. `check_ranges` raises one ConfigError naming the field,
the allowed range and a value that works. The other groups are built the way
the run builds them: `config.distributed.*` (before the multi-host set-up reads
it), a random-init model's `model.tiny` (a ModelConfig, no weights) and the
rollouts' and eval's `SamplingParams` (`sampling_params`, `eval_params`, which
the trainer uses too). `validate_config` (gdpo_jax.train.config) calls them all.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from typing import Any

import ml_collections as mlc

from gdpo_jax.errors import ConfigError
from gdpo_jax.multihost import cluster_env, mpi_launch, undetected_launch_message
from gdpo_jax.train.schema import _choice, _get

__all__ = [
    "RANGES",
    "Range",
    "check_distributed",
    "check_ranges",
    "check_sampling",
    "check_tiny_model",
    "eval_params",
    "sampling_params",
]


@dataclasses.dataclass(frozen=True)
class Range:
    """field: dotted config path; low / high: bounds (None: none), inclusive
    unless low_open / high_open; integer: the value must be an int; note: what
    special values mean (e.g. "0 = off"); example: a value to suggest."""

    field: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    note: str = ""
    example: str = ""

    def describe(self) -> str:
        kind = "an int" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            where = f"in {left}{_num(self.low)}, {_num(self.high)}{right}"
        elif self.low is not None:
            where = f"{'>' if self.low_open else '>='} {_num(self.low)}"
        else:
            where = f"{'<' if self.high_open else '<='} {_num(self.high)}"
        return f"{kind} {where}" + (f" ({self.note})" if self.note else "")

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        if self.integer and not isinstance(value, numbers.Integral):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        if self.high is not None:
            return value < self.high if self.high_open else value <= self.high
        return True


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _int(field: str, low: int, note: str = "", example: str = "") -> Range:
    return Range(field, low=low, integer=True, note=note, example=example or str(low))


def _nonneg(field: str, note: str = "", example: str = "0") -> Range:
    return Range(field, low=0.0, note=note, example=example)


RANGES: tuple[Range, ...] = (
    _nonneg("algo.eps", example="1e-4"),
    Range("algo.clip_low", low=0.0, high=1.0, high_open=True, example="0.2"),
    _nonneg("algo.clip_high", example="0.2"),
    _nonneg("algo.beta"),
    _nonneg("algo.kl_in_reward"),
    _nonneg("algo.entropy_coef"),
    _int("algo.max_len", 0, "0 = sampling.max_new_tokens"),
    _int("algo.logprob_chunk_size", 0, "0 = full-vocabulary log-softmax"),
    _int("algo.dynamic_sampling_max_tries", 1, example="4"),
    Range("optim.lr", low=0.0, low_open=True, example="1e-6"),
    _int("optim.warmup_steps", 0),
    Range("optim.min_lr_ratio", low=0.0, high=1.0, note="the schedule's end, times lr"),
    _nonneg("optim.weight_decay"),
    Range("optim.b1", low=0.0, high=1.0, high_open=True, example="0.9"),
    Range("optim.b2", low=0.0, high=1.0, high_open=True, example="0.999"),
    _nonneg("optim.eps", example="1e-8"),
    _nonneg("optim.max_grad_norm", "0 = no clipping", example="1.0"),
    _int("train.num_steps", 1, example="100"),
    _int("train.log_every", 1),
    _int("train.eval_every", 0, "0 = no periodic eval"),
    _int("train.stop_after_step", 0, "0 = run to the end"),
    _int("train.eval_num_examples", 0, "0 = the whole held-out split"),
    _int("eval.num_samples", 1),
    # jax.random.key's and NumPy's seeds: the prompt stream failed on -1 after the build.
    Range("seed", low=0, high=2**32 - 1, integer=True, example="0"),
    _int("checkpoint.every", 0, "0 = no checkpoints", example="10"),
    _int("checkpoint.keep", 1, example="3"),
    _int("task.num_train", 0, "a file source's first N records; 0 = all", example="2048"),
    _int("task.num_eval", 0, example="64"),
    _int("rewards.num_workers", 1, example="4"),
    Range("rewards.timeout_s", low=0.0, low_open=True, example="30.0"),
    _int("rewards.chunk_size", 0, "0 = split the rows evenly over the workers"),
    _int("distributed.num_processes", 0, "0 = from the cluster environment"),
    _int("distributed.process_id", -1, "-1 = from the cluster environment", example="-1"),
)


def check_ranges(cfg: mlc.ConfigDict, ranges: tuple[Range, ...] = RANGES) -> None:
    """Raises ConfigError for the first field of `ranges` outside its range."""
    for r in ranges:
        try:
            value = _get(cfg, r.field)
        except (KeyError, AttributeError):  # a config from before the field existed
            continue
        if not r.holds(value):
            raise ConfigError(
                f"config.{r.field}={value!r} must be {r.describe()}; e.g. "
                f"--config.{r.field}={r.example or 0}."
            )


def check_distributed(cfg: mlc.ConfigDict) -> None:
    """config.distributed.*, checked before `jax.distributed.initialize` reads them
    (touches no device: the CLI calls it before the multi-host set-up)."""
    _choice(cfg, "distributed.initialize", ("auto", "always", "never"))
    d = cfg.distributed
    check_ranges(cfg, tuple(r for r in RANGES if r.field.startswith("distributed.")))
    if (
        d.initialize != "never"
        and d.num_processes > 1
        and not d.coordinator_address
        # else JAX finds the coordinator in the environment (srun's, not an salloc
        # shell's: SLURM_JOB_ID alone gave JAX's "coordinator_address should be defined")
        and cluster_env() is None
    ):
        raise ConfigError(
            f"config.distributed.num_processes={d.num_processes} needs "
            "config.distributed.coordinator_address (host:port of process 0) outside a "
            "cluster environment JAX detects; set it, or leave num_processes=0."
        )
    launch = mpi_launch()
    if (
        d.initialize != "never"
        and launch is not None
        and not d.coordinator_address
        and d.num_processes <= 1
        and cluster_env() is None
    ):
        raise ConfigError(undetected_launch_message(launch))
    if d.process_id >= max(d.num_processes, 1) and d.num_processes:
        raise ConfigError(
            f"config.distributed.process_id={d.process_id} must be below "
            f"distributed.num_processes={d.num_processes} (or -1 = from the environment)."
        )


def check_tiny_model(cfg: mlc.ConfigDict) -> None:
    """A random-init model's config.model.tiny sizes make a valid ModelConfig (built
    without weights): a zero or odd size failed in the model build or in the step."""
    if cfg.model.name:
        return
    from gdpo_jax.models.config import ModelConfig

    try:
        ModelConfig.tiny(**cfg.model.tiny.to_dict())
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"config.model.tiny: {e} Set --config.model.tiny.<field> to a valid size."
        ) from None


def sampling_params(cfg) -> Any:
    """The rollouts' SamplingParams from config.sampling (ValueError on a bad field)."""
    from gdpo_jax.sampling.params import SamplingParams

    s = cfg.sampling
    return SamplingParams(
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        stop_strings=tuple(s.stop_strings),
    )


def eval_params(cfg) -> Any:
    """The held-out eval's SamplingParams: config.eval's temperature, top_p and greedy,
    the rollouts' width and stop strings."""
    from gdpo_jax.sampling.params import SamplingParams

    s, e = cfg.sampling, cfg.eval
    return SamplingParams(
        max_new_tokens=s.max_new_tokens,
        temperature=e.temperature,
        top_p=e.top_p,
        greedy=e.greedy,
        stop_strings=tuple(s.stop_strings),
    )


def check_sampling(cfg: mlc.ConfigDict) -> None:
    """Builds the run's two SamplingParams (rollouts, eval) as the trainer does; their
    errors become ConfigErrors naming config.sampling.<field> / config.eval.<field>."""
    for section, make in (("sampling", sampling_params), ("eval", eval_params)):
        try:
            make(cfg)
        except (ValueError, TypeError) as e:  # "SamplingParams.top_p=1.5 must be in ..."
            field = re.match(r"SamplingParams\.(\w+)", str(e))
            name = field.group(1) if field else "<field>"
            if section == "eval" and name in ("max_new_tokens", "stop_strings"):
                section = "sampling"  # the eval takes these two from config.sampling
            raise ConfigError(
                f"{str(e).replace('SamplingParams.', f'config.{section}.')} Set "
                f"--config.{section}.{name} accordingly."
            ) from None


def check_model_fields(cfg: mlc.ConfigDict) -> None:
    """config.model's dtypes and attention kernel (for the backend the programs are built
    for), checked before the model build (RL and SFT)."""
    from gdpo_jax.models.config import ATTENTION_KINDS, REMAT_POLICIES, canonical_dtype

    names = {}
    for field in ("dtype", "param_dtype"):  # else the model build fails, after the work
        try:
            names[field] = canonical_dtype(cfg.model[field], f"config.model.{field}")
        except ValueError as e:
            raise ConfigError(f"{e} Set --config.model.{field}=float32.") from None
    if names["param_dtype"] == "float16":
        # AdamW keeps its moments and eps in the parameters' dtype: in float16 eps=1e-8
        # is 0 and a gradient under ~8e-3 squares to 0, so the first update divides 0 by
        # 0 and the weights turn NaN (there is no loss scaling). float16 compute is fine.
        raise ConfigError(
            "config.model.param_dtype='float16': AdamW's moments and eps underflow in "
            "float16 and the first update turns the weights NaN; set "
            "--config.model.param_dtype=bfloat16 (the same memory) or float32."
        )
    _choice(cfg, "model.attention", ATTENTION_KINDS)
    _choice(cfg, "model.remat_policy", REMAT_POLICIES)
    if cfg.model.remat_policy != "full" and not cfg.model.remat:
        raise ConfigError(
            f"config.model.remat_policy={cfg.model.remat_policy!r} is read only with "
            "model.remat=True; set --config.model.remat=True, or leave the policy 'full'."
        )
    if cfg.model.attention in ("cudnn", "splash"):
        # The backend the programs are built for (the planner's target, else JAX's).
        from gdpo_jax.backend import effective_backend

        backend = effective_backend()
        # By the dtype's name: "half" (float16) was refused as not a 16-bit dtype.
        if cfg.model.attention == "cudnn" and (
            backend != "gpu" or names["dtype"] not in ("bfloat16", "float16")
        ):
            raise ConfigError(
                f"config.model.attention='cudnn' needs a GPU and model.dtype bfloat16/float16 "
                f"(backend {backend!r}, dtype {cfg.model.dtype!r}); set "
                "--config.model.attention=auto."
            )
        if cfg.model.attention == "splash" and backend != "tpu":
            raise ConfigError(
                f"config.model.attention='splash' is the Pallas TPU kernel (backend "
                f"{backend!r}); set --config.model.attention=auto."
            )
