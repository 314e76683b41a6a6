"""The predictions of issue 16's studies, as tests on paired per-seed quantities.

Written (and committed, with docs/results/<study>/predictions.md) before the
runs. Each prediction is a contrast sum_i coef_i * q_i(estimator_i) per seed;
it "held" when the 95 % CI (over seeds) of its mean lies above `margin`, "did
not hold" when it lies below, else it is inconclusive
(experiments/compare_stats.judge). The studies committed so far named the
percentile bootstrap CI; the report now judges with Student's t interval and
shows the bootstrap's verdict beside it (experiments/restat_studies.py re-judges
the committed ones). Quantities (experiments/compare_stats.study_stats):
final:<eval key>, auc:<eval key>, init:<eval key>, train_auc:<reward>,
share:<reward>, share_early:<reward> (steps 1-10).
"""

from __future__ import annotations

from typing import Any


def _diff(q: str, a: str, b: str) -> list[tuple[float, str, str]]:
    return [(1.0, a, q), (-1.0, b, q)]


def _gain_gap(r_rare: str, r_other: str) -> list[tuple[float, str, str]]:
    """(GDPO - GRPO) on train_auc of r_rare minus the same on r_other."""
    return _diff(f"train_auc:{r_rare}", "gdpo", "grpo") + [
        (-c, e, q) for c, e, q in _diff(f"train_auc:{r_other}", "gdpo", "grpo")
    ]


PREDICTIONS: dict[str, list[dict[str, Any]]] = {
    "format_cold": [
        {
            "id": "F1",
            "text": "GDPO's held-out format after the last step exceeds GRPO's",
            "terms": _diff("final:eval/format", "gdpo", "grpo"),
        },
        {
            "id": "F2",
            "text": "GDPO learns the format faster: AUC of the training format reward above GRPO's",
            "terms": _diff("train_auc:toolcall_format", "gdpo", "grpo"),
        },
        {
            "id": "F3a",
            "text": "GRPO's training format AUC exceeds GRPO w/o std's",
            "terms": _diff("train_auc:toolcall_format", "grpo", "grpo_no_std"),
        },
        {
            "id": "F3b",
            "text": "GDPO's training format AUC exceeds GRPO w/o std's",
            "terms": _diff("train_auc:toolcall_format", "gdpo", "grpo_no_std"),
        },
        {
            "id": "F3",
            "text": "GRPO w/o std learns the format slowest (F3a and F3b)",
            "all_of": ["F3a", "F3b"],
        },
        {
            "id": "F4",
            "text": "the format reward's share of the advantage is higher under GDPO than GRPO",
            "terms": _diff("share:toolcall_format", "gdpo", "grpo"),
        },
        {
            "id": "F5",
            "text": "GDPO costs no more than 0.5 held-out correctness ([-3, 3]) against GRPO",
            "terms": _diff("final:eval/toolcall_correctness", "gdpo", "grpo"),
            "margin": -0.5,
        },
    ],
    # The same statements at toy size (format {0,1} + correctness [-3,3] from a random init).
    "format_cold_toy": [
        {
            "id": "F1",
            "text": "GDPO's held-out format after the last step exceeds GRPO's",
            "terms": _diff("final:eval/format", "gdpo", "grpo"),
        },
        {
            "id": "F2",
            "text": "GDPO learns the format faster: AUC of the training format reward above GRPO's",
            "terms": _diff("train_auc:toy_format", "gdpo", "grpo"),
        },
        {
            "id": "F3a",
            "text": "GRPO's training format AUC exceeds GRPO w/o std's",
            "terms": _diff("train_auc:toy_format", "grpo", "grpo_no_std"),
        },
        {
            "id": "F3b",
            "text": "GDPO's training format AUC exceeds GRPO w/o std's",
            "terms": _diff("train_auc:toy_format", "gdpo", "grpo_no_std"),
        },
        {
            "id": "F3",
            "text": "GRPO w/o std learns the format slowest (F3a and F3b)",
            "all_of": ["F3a", "F3b"],
        },
        {
            "id": "F4",
            "text": "the format reward's share of the advantage is higher under GDPO than GRPO",
            "terms": _diff("share:toy_format", "gdpo", "grpo"),
        },
        {
            "id": "F5",
            "text": "GDPO costs no more than 0.5 held-out correctness ([-3, 3]) against GRPO",
            "terms": _diff("final:eval/toy_correct_pm3", "gdpo", "grpo"),
            "margin": -0.5,
        },
    ],
    "three_binary": [
        {
            "id": "T0a",
            "text": "premise: at step 0 three_correct is rarer than three_short",
            "terms": [
                (1.0, "grpo", "init:eval/three_short"),
                (-1.0, "grpo", "init:eval/three_correct"),
            ],
        },
        {
            "id": "T0b",
            "text": "premise: at step 0 three_correct is rarer than three_marker",
            "terms": [
                (1.0, "grpo", "init:eval/three_marker"),
                (-1.0, "grpo", "init:eval/three_correct"),
            ],
        },
        {
            "id": "T1a",
            "text": "GDPO's train-AUC gain over GRPO: larger on three_correct than three_short",
            "terms": _gain_gap("three_correct", "three_short"),
        },
        {
            "id": "T1b",
            "text": "GDPO's train-AUC gain over GRPO: larger on three_correct than three_marker",
            "terms": _gain_gap("three_correct", "three_marker"),
        },
        {
            "id": "T1",
            "text": "GDPO's gain is largest on the rarest reward (T1a and T1b)",
            "all_of": ["T1a", "T1b"],
        },
        {
            "id": "T2",
            "text": "GDPO's training AUC of three_correct exceeds GRPO's",
            "terms": _diff("train_auc:three_correct", "gdpo", "grpo"),
        },
        {
            "id": "T3",
            "text": "GDPO's held-out three_correct after the last step exceeds GRPO's",
            "terms": _diff("final:eval/three_correct", "gdpo", "grpo"),
        },
        {
            "id": "T4",
            "text": "three_correct's advantage share (steps 1-10) is higher under GDPO than GRPO",
            "terms": _diff("share_early:three_correct", "gdpo", "grpo"),
        },
        {
            "id": "T5",
            "text": "GDPO's training AUC of three_correct exceeds GRPO w/o std's",
            "terms": _diff("train_auc:three_correct", "gdpo", "grpo_no_std"),
        },
    ],
}
