"""The studies of issue 16: their config files and default estimators.

`python -m experiments.compare_estimators --study=<name>` runs one. Each study
has its own RL config (configs/<rl>.py) and warm start (configs/<sft>.py, or
None: RL from a random init); its name is the report's key
(compare_report.TABLE, study_predictions.PREDICTIONS).
"""

from __future__ import annotations

from typing import Any

STUDY_ESTIMATORS = ("grpo", "grpo_no_std", "gdpo")
STUDIES: dict[str, dict[str, Any]] = {
    "format_cold": {"task": "toolcall", "rl": "study_format_cold", "sft": "sft_format_cold"},
    "three_binary": {"task": "three_binary", "rl": "study_three_binary", "sft": None},
    "format_cold_toy": {"task": "toy_toolcall", "rl": "study_format_cold_toy", "sft": None},
}


def rl_config_name(task: str) -> str:
    """configs/<name>.py of the RL runs: a study's own, else replica_<task>."""
    return STUDIES[task]["rl"] if task in STUDIES else f"replica_{task}"


def sft_config_name(task: str) -> str | None:
    """configs/<name>.py of the warm start (None: the study starts from a random init)."""
    return STUDIES[task]["sft"] if task in STUDIES else f"sft_{task}"
