"""What a run prints: quiet third-party logs, a start line, config.json, an end summary.

logs.setup_logging("info")            # gdpo_jax.* at INFO, absl/orbax/jax/... at WARNING
logs.save_config(cfg)                 # <workdir>/config.json (call it on process 0), as big_vision
log.info(logs.describe(cfg))          # one line: task, model, estimator, rewards, sizes
for line in logs.summary(cfg.workdir, seconds=...): log.info(line)
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

from gdpo_jax.train import paths

LEVELS = ("debug", "info", "warning", "error")
# Loggers of libraries that log internals at INFO (Orbax logs ~30 lines per checkpoint).
THIRD_PARTY = (
    "absl",
    "orbax",
    "jax",
    "jaxlib",
    "etils",
    "tensorboardX",
    "matplotlib",
    "grain",
    "datasets",
    "transformers",
    "fsspec",
    "urllib3",
    "filelock",
    "httpx",
    "PIL",
)


def setup_logging(level: str = "info") -> None:
    """One stderr handler; the project's loggers (`gdpo_jax.*`) at `level`, the rest at WARNING.

    level="debug" also lets third-party INFO through (Orbax, absl, JAX internals).
    """
    if level not in LEVELS:
        raise ValueError(f"--log_level={level!r}; choose one of {LEVELS}.")
    own = getattr(logging, level.upper())
    others = logging.INFO if level == "debug" else logging.WARNING
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname).1s %(name)s] %(message)s", "%H:%M:%S")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]  # replaces absl's handler (long prefixes, thread ids)
    root.setLevel(others)
    for name in THIRD_PARTY:
        logging.getLogger(name).setLevel(others)
    logging.getLogger("gdpo_jax").setLevel(own)
    if level != "debug":
        # transformers' "advice" warnings, e.g. "PyTorch was not found. Models won't be
        # available" on import in a torch-free install (`make demo`): gdpo_jax uses
        # transformers only for tokenizers and configs. Read at each call, so this also
        # covers an import that comes later. Real warnings still print.
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:  # absl keeps its own verbosity (Orbax logs through absl.logging)
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.INFO if level == "debug" else absl_logging.WARNING)
    except ImportError:
        pass


def config_json(cfg: Any) -> str:
    from gdpo_jax.train.config import config_to_dict

    return json.dumps(config_to_dict(cfg), indent=2, sort_keys=True)


def save_config(cfg: Any, workdir: str | None = None) -> str:
    """Writes the resolved config to `<workdir>/config.json` (overwritten on each start)."""
    workdir = workdir or cfg.workdir
    paths.makedirs(workdir)
    path = paths.join(workdir, "config.json")
    with paths.open_file(path, "w") as f:
        f.write(config_json(cfg) + "\n")
    return path


def describe(cfg: Any) -> str:
    """One line: what is trained on what, by which estimator, at which size."""
    r = cfg.rewards
    weights = tuple(r.weights) or (1.0,) * len(tuple(r.names))
    rewards = ", ".join(f"{n} x{w:g}" for n, w in zip(tuple(r.names), weights))
    model = cfg.model.name or f"random-init tiny ({cfg.model.tokenizer} tokenizer)"
    a = cfg.algo
    return (
        f"{a.estimator} on task {cfg.task.name}, model {model}, rewards [{rewards}], "
        f"{cfg.train.num_steps} steps of {a.num_prompts} prompts x {a.group_size}, seed {cfg.seed}"
    )


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def summary(
    workdir: str, *, seconds: float | None = None, tensorboard: bool = True, plots: list[str] = ()
) -> list[str]:
    """A few lines for the end of a run: last metrics, and where every output went."""
    from gdpo_jax.train.metrics import read_jsonl

    metrics = paths.join(workdir, "metrics.jsonl")
    lines = []
    if paths.exists(metrics):
        recs = read_jsonl(metrics)
        if recs:
            last = max(recs)
            train = {
                k.split("/")[1]: v
                for k, v in recs[last].items()
                if k == "reward/total" or (k.startswith("reward/") and k.endswith("/mean"))
            }
            evals = [s for s in recs if any(k.startswith("eval/") for k in recs[s])]
            took = f" in {seconds:.0f} s" if seconds is not None else ""
            lines.append(
                f"step {last}{took}; training rewards: "
                + ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(train.items()))
            )
            if evals:
                e = recs[max(evals)]
                lines.append(
                    f"held-out at step {max(evals)}: "
                    + ", ".join(
                        f"{k[5:]}={_fmt(v)}" for k, v in sorted(e.items()) if k.startswith("eval/")
                    )
                )
        lines.append(f"metrics:     {metrics}")
    lines.append(f"config:      {paths.join(workdir, 'config.json')}")
    if plots:
        lines.append(f"plots:       {paths.join(workdir, 'plots')}/ ({len(plots)} PNG files)")
    if tensorboard:
        lines.append(f"TensorBoard: tensorboard --logdir {paths.join(workdir, 'tb')}")
    return lines
