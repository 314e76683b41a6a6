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
(GDPO_JAX_NO_RELAUNCH=1). The difference is what the re-exec costs. A third
refusal, of a model field, runs the config checks that read the model's and the
sampler's host-side modules (`gdpo_jax.models.config`, `gdpo_jax.sampling.params`).
Then one
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
import tempfile
import time
from typing import Any, NamedTuple

from benchmarks import common

DEFAULT_OUT = "runs/bench/import.json"


class Target(NamedTuple):
    """One timed command: `python <args>`, which must exit with `status`; `relaunch`:
    started as a user's first CLI run is (re-executed with the malloc tunable)."""

    name: str
    args: tuple[str, ...]
    relaunch: bool = False
    status: int = 0


# The refusals' workdir, never made: the config is refused before anything is written.
_REFUSED_WORKDIR = os.path.join(tempfile.gettempdir(), "gdpo_jax_profile_import_refused")
CLI = ("-m", "experiments.train", "--config=configs/tiny_cpu.py")
# A field the model's checks refuse: the config checks read the model's and the
# sampler's host-side modules, which imported flax (about 0.5 s) until their packages'
# names loaded on first use.
CLI_MODEL_FIELD = (*CLI, f"--config.workdir={_REFUSED_WORKDIR}", "--config.model.dtype=float33")
REEXEC = "train CLI's refusal, re-executed"
ONE_IMAGE = "train CLI's refusal, one process"
TARGETS: tuple[Target, ...] = (
    Target("python", ("-c", "pass")),
    Target("numpy", ("-c", "import numpy")),
    Target("ml_dtypes", ("-c", "import ml_dtypes")),
    Target("jax", ("-c", "import jax")),
    Target("gdpo_jax", ("-c", "import gdpo_jax")),
    Target("trainer", ("-c", "import gdpo_jax.train.loop")),
    # Refusing a config without a workdir (its one-line error, status 2).
    Target(REEXEC, CLI, relaunch=True, status=2),
    Target(ONE_IMAGE, CLI, status=2),
    Target("train CLI's refusal of a model field, re-executed", CLI_MODEL_FIELD, True, 2),
)
TRACED = "trainer"  # the target whose import `python -X importtime` lists
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


def _wall_s(target: Target) -> float:
    """Seconds for the target's `python <args>` in a fresh interpreter (from the
    repository root), from start to exit; a RuntimeError if its status is not the
    target's."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *target.args], env=_env(target.relaunch), cwd=ROOT, capture_output=True
    )
    seconds = time.perf_counter() - t0
    if done.returncode != target.status:
        raise RuntimeError(
            f"python {' '.join(target.args)}: status {done.returncode}\n{done.stderr[-2000:]}"
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
    for target in TARGETS:
        _wall_s(target)  # each target's files into the page cache before any round
    times: dict[str, list[float]] = {t.name: [] for t in TARGETS}
    for _ in range(repeats):
        for target in TARGETS:
            times[target.name].append(_wall_s(target))
    rows = [
        {
            "target": t.name,
            "command": " ".join(["python", *t.args]),
            "relaunch": t.relaunch,
            "median_s": round(statistics.median(times[t.name]), 3),
            "best_s": round(min(times[t.name]), 3),
        }
        for t in TARGETS
    ]
    median = {r["target"]: r["median_s"] for r in rows}
    (traced_target,) = [t for t in TARGETS if t.name == TRACED]
    traced = subprocess.run(
        [sys.executable, "-X", "importtime", *traced_target.args],
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
        "relaunch_cost_s": round(median[REEXEC] - median[ONE_IMAGE], 3),
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
