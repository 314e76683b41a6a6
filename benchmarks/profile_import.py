r"""What starting a process costs: the import of jax and of gdpo_jax's trainer,
and a CLI's start to its first line.

Every CLI (`gdpo-train`, `gdpo-sft`, a benchmark's child, a reward worker pool's
process) and every subprocess a test starts imports jax before it does any work.
This profile times, in fresh interpreters and in turn (`repeats` rounds, each
target once per round, so machine noise hits them alike), the wall time of each of
TARGETS: Python alone, numpy, ml_dtypes (jax's dtype extension), jax, gdpo_jax, the
trainer (`gdpo_jax.train.loop`), and `python -m experiments.train` refusing a config
without a workdir (its one-line error, status 2) twice: as users run it, re-executed
with the malloc tunable (gdpo_jax/hostenv.py), and in one process image
(GDPO_JAX_NO_RELAUNCH=1). The difference is what the re-exec costs. Then one
`python -X importtime` run of the trainer's import lists the modules with the
largest time of their own (`self_ms`, without what they import).

The JSON records the ml_dtypes version the children imported: with 0.7.0 its
extension took about 1 s beside numpy 2.4.6 (registering its ufunc loops), which is
why setup.py pins 0.6.0; run with `PYTHONPATH=<a folder holding another version>`
to time that one.

    python -m benchmarks.profile_import [--quick] [--out runs/bench/import.json]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks import common

DEFAULT_OUT = "runs/bench/import.json"
# (name, the interpreter's arguments, re-executed with the tunable as a CLI is).
TARGETS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("python", ("-c", "pass"), False),
    ("numpy", ("-c", "import numpy"), False),
    ("ml_dtypes", ("-c", "import ml_dtypes"), False),
    ("jax", ("-c", "import jax"), False),
    ("gdpo_jax", ("-c", "import gdpo_jax"), False),
    ("trainer", ("-c", "import gdpo_jax.train.loop"), False),
)
CLI = ("-m", "experiments.train", "--config=configs/tiny_cpu.py")
CLI_TARGETS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("train CLI's refusal, re-executed", CLI, True),
    ("train CLI's refusal, one process", CLI, False),
)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = 12  # modules listed by their own import time


def _env(relaunch: bool = False) -> dict[str, str]:
    """A child's environment: CPU JAX (libtpu's lock untouched); `relaunch`: without
    the malloc tunable, so a CLI re-executes to add it, as on a user's first start;
    otherwise with gdpo_jax's re-exec off (one process image)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "GDPO_JAX_NO_RELAUNCH": "1"}
    if relaunch:
        del env["GDPO_JAX_NO_RELAUNCH"]
        env.pop("GLIBC_TUNABLES", None)
    return env


def _wall_s(args: tuple[str, ...], relaunch: bool = False) -> float:
    """Seconds for `python <args>` in a fresh interpreter (from the repository root),
    from start to exit; it must exit 0, or 2 for the CLI's refusal."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *args], env=_env(relaunch), cwd=ROOT, capture_output=True
    )
    seconds = time.perf_counter() - t0
    if done.returncode != (2 if args == CLI else 0):
        raise RuntimeError(
            f"python {' '.join(args)}: status {done.returncode}\n{done.stderr[-2000:]}"
        )
    return seconds


def parse_importtime(stderr: str) -> list[dict[str, Any]]:
    """`python -X importtime`'s lines ("import time: self | cumulative | name", in
    microseconds) as [{module, self_ms, cumulative_ms}], slowest own time first."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, name = line[len("import time:") :].split("|")
        rows.append(
            {
                "module": name.strip(),
                "self_ms": int(own) / 1e3,
                "cumulative_ms": int(cumulative) / 1e3,
            }
        )
    return sorted(rows, key=lambda r: -r["self_ms"])


def _child_ml_dtypes() -> str:
    """The ml_dtypes version a child interpreter imports (PYTHONPATH may change it)."""
    code = "import ml_dtypes; print(ml_dtypes.__version__)"
    out = subprocess.run([sys.executable, "-c", code], env=_env(), check=True, capture_output=True)
    return out.stdout.decode().strip()


def run(quick: bool = False) -> dict[str, Any]:
    """{rows: [{target, command, relaunch, median_s, best_s}], relaunch_cost_s,
    top_self_ms, ml_dtypes, ...}."""
    repeats = 3 if quick else 9
    targets = TARGETS + CLI_TARGETS
    for _, args, relaunch in targets[-1:] + TARGETS[-1:]:
        _wall_s(args, relaunch)  # the files into the page cache before any round
    times: dict[str, list[float]] = {name: [] for name, _, _ in targets}
    for _ in range(repeats):
        for name, args, relaunch in targets:
            times[name].append(_wall_s(args, relaunch))
    rows = [
        {
            "target": name,
            "command": " ".join(["python", *args]),
            "relaunch": relaunch,
            "median_s": round(statistics.median(times[name]), 3),
            "best_s": round(min(times[name]), 3),
        }
        for name, args, relaunch in targets
    ]
    traced = subprocess.run(
        [sys.executable, "-X", "importtime", *TARGETS[-1][1]],
        env=_env(),
        check=True,
        capture_output=True,
        text=True,
    )
    modules = parse_importtime(traced.stderr)
    return {
        "benchmark": "profile_import",
        "quick": quick,
        "repeats": repeats,
        "ml_dtypes": _child_ml_dtypes(),
        "rows": rows,
        # The CLI's start re-executed minus in one process image, by median.
        "relaunch_cost_s": round(rows[-2]["median_s"] - rows[-1]["median_s"], 3)
        if CLI_TARGETS
        else None,
        "trainer_import_ms": round(max(r["cumulative_ms"] for r in modules), 1),
        "top_self_ms": [
            {"module": r["module"], "self_ms": round(r["self_ms"], 1)} for r in modules[:TOP]
        ],
        "machine": common.machine_info(),
    }


def format_table(res: dict[str, Any]) -> str:
    """The wall-time table, then the slowest modules of the trainer's import."""
    head = (
        f"Starting a process on {common.describe_machine(res['machine'])}, ml_dtypes "
        f"{res['ml_dtypes']} ({res['repeats']} rounds, each target once per round); the "
        f"re-exec's cost (medians): {res['relaunch_cost_s']} s"
    )
    table = common.markdown_table(
        [
            {"import": r["target"], "median s": r["median_s"], "best s": r["best_s"]}
            for r in res["rows"]
        ]
    )
    top = common.markdown_table(
        [{"module (own time)": r["module"], "ms": r["self_ms"]} for r in res["top_self_ms"][:6]]
    )
    return f"{head}\n\n{table}\n\n{top}"


def main() -> None:
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # the children start as a CLI does, with the tunable
    common.quick_out_main(__doc__, run, format_table, DEFAULT_OUT, "Three rounds, not nine.")


if __name__ == "__main__":
    main()
