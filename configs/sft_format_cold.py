r"""Format-cold SFT warm start (issue 16): most targets lack the ToolRL tag structure.

configs/sft_toolcall.py with 80 % of the SFT targets' tag structure broken
(sft.format_noise = 0.8) instead of 30 %: the policy still learns which tool
to call and with which arguments (correctness above zero), but samples the
exact format only rarely (aimed at about 0.1-0.3 at T = 1; measured 0.35 in
docs/results/format_cold), so the {0, 1} format reward has room to climb under RL.
The warm start of configs/study_format_cold.py.

    python -m experiments.sft --config=configs/sft_format_cold.py \
        --config.workdir=runs/study/format_cold/sft
"""

from configs.sft_toolcall import get_config as _toolcall_sft


def get_config(arg: str = ""):
    c = _toolcall_sft(arg)
    c.sft.format_noise = 0.8
    return c
