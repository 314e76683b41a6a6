r"""SFT warm start entry point (cross-entropy on completion tokens) from a config file.

    python -m experiments.sft --config=configs/sft_toolcall.py \
        --config.workdir=runs/replica/sft_toolcall
    python -m experiments.sft --config=configs/sft_math.py --config.workdir=runs/replica/sft_math

Any field can be overridden with --config.a.b=value (e.g. --config.sft.num_steps=300).
Writes <workdir>/hf (Hugging Face dir: the RL configs' model.name),
<workdir>/sft_result.json and <workdir>/metrics.jsonl; rerunning with the same
workdir resumes from its latest checkpoint (when config.checkpoint.every > 0).
"""

from __future__ import annotations

import json
import logging
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a configs/sft_*.py file.", lock_config=True
)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from gdpo_jax.train.config import ConfigError
    from gdpo_jax.train.sft import run_sft

    try:
        result = run_sft(_CONFIG.value)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({k: v for k, v in result.items()}, indent=2))


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main)
