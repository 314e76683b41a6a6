r"""Did a change make our RL iteration slower? Two commits, timed in turn, in one session.

A machine kind's `run_all` rows are of different sessions, and on the 2-core CPUs
seen one session's RL iteration can be 10 % slower than another's with the same
code (docs/benchmarks.md, "RL iteration"): two rows cannot tell a slower commit
from a slower session. This times bench_rl's iteration (our side only: its
trainer, batch and layout, `bench_rl.bench_ours`) for a base commit and the
working tree alternately, each run in a fresh process with the huge-page malloc
tunable, `--pairs` times each, and compares the runs' medians. Each run's record keeps
the machine's activity around it (benchmarks/host.py), and the table names the runs
that shared the machine or whose huge pages fell back.

The base is checked out into a temporary git worktree (removed after); each run
imports `benchmarks.bench_rl` and `gdpo_jax` from its own tree, so the base must
have `bench_rl.bench_ours` and `bench_rl.make_checkpoint` (2026-11-26 on). Both
sides run with this checkout's virtual environment.

    python -m benchmarks.ab_commits --base 4338de7 [--pairs 7] [--beta 0] \
        [--model smollm2] [--iters 4] [--out runs/bench/ab_commits.json]

`--model` takes a bench_rl.SHAPES key (the base's bench_rl must have it; SmolLM2-135M's
shape from 2026-11-26 on); `--iters` the timed iterations per run (at SmolLM2's size
an iteration takes about 10 s on the 2-core CPUs).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERIES = ("iter_s", "sample_s", "step_s")  # bench_ours' series compared
WARMUP, ITERS = 2, 12  # per run: untimed, then timed iterations


def resolve(commit: str, repo: str = ROOT) -> str:
    """The full hash of `commit` in `repo`; ValueError naming the flag when it is none."""
    out = subprocess.run(
        ["git", "-C", repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise ValueError(f"--base={commit!r} is not a commit of {repo}; give a hash or a ref.")
    return out.stdout.strip()


def _child(beta: float, model: str = "tiny", iters: int = ITERS) -> dict[str, float]:
    """One run (in the tree on PYTHONPATH): bench_rl's trainer at `model`'s shape
    (bench_rl.SHAPES), the medians of its series over `iters` iterations."""
    from benchmarks import bench_rl as B

    kw = {} if model == "tiny" else {"shape": B.SHAPES[model]}  # trees before SHAPES
    with tempfile.TemporaryDirectory(prefix="ab_ckpt_") as tmp:
        ckpt = B.make_checkpoint(tmp, kw.get("shape", B.TINY))
        series = B.bench_ours(ckpt, beta, warmup=WARMUP, iters=iters, **kw)
    return {k: statistics.median(series[k]) for k in SERIES}


def run_tree(tree: str, beta: float, model: str = "tiny", iters: int = ITERS) -> dict[str, float]:
    """One run of `_child` in a fresh process that imports from `tree` (JAX_PLATFORMS:
    the parent's)."""
    from benchmarks import common

    args = ["--beta", str(beta), "--model", model, "--iters", str(iters)]
    return common.run_child("benchmarks.ab_commits", args, tree=tree)


def alternate(
    trees: dict[str, str], pairs: int, beta: float, runner: Callable[[str, float], dict] = run_tree
) -> dict[str, list[dict[str, Any]]]:
    """`pairs` runs per side, in turn; the side that goes first swaps every pair. Each
    run's record also holds the machine's activity around it (`"host"`:
    `common.host_activity`: other processes' CPU, huge-page fallbacks)."""
    from benchmarks import common

    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in trees}
    sides = list(trees)
    for i in range(pairs):
        for side in sides if i % 2 == 0 else sides[::-1]:
            before = common.host_counters()
            run = runner(trees[side], beta)
            runs[side].append(run | {"host": common.host_activity(before, common.host_counters())})
    return runs


def disturbed(res: dict[str, Any]) -> list[str]:
    """The runs that did not have the machine to themselves: other processes used more
    than `common.LOADED_FRAC` of the cores, or huge pages fell back or waited for
    compaction ("base run 3: 12% other CPU"); none for runs recorded without it."""
    from benchmarks import common

    out = []
    for side in ("base", "head"):
        for i, run in enumerate(res["runs"][side]):
            host = run.get("host", {})
            why = []
            if (host.get("other_cpu_frac") or 0.0) > common.LOADED_FRAC:
                why.append(f"{host['other_cpu_frac']:.0%} other CPU")
            for key in ("huge_page_fallbacks", "compaction_stalls"):
                if host.get(key):
                    why.append(f"{host[key]} {key.replace('_', ' ')}")
            if why:
                out.append(f"{side} run {i + 1}: {', '.join(why)}")
    return out


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per series: each side's median over its runs, and head / base (above 1: head slower)."""
    out = {}
    for key in SERIES:
        base = statistics.median(r[key] for r in runs["base"])
        head = statistics.median(r[key] for r in runs["head"])
        out[key] = {"base_s": base, "head_s": head, "head_over_base": head / base}
    return out


_NAMES = {"iter_s": "RL iteration", "sample_s": "sampling", "step_s": "step"}


def table_markdown(res: dict[str, Any]) -> str:
    """The comparison's markdown table, with its runs and machine under it."""
    from benchmarks import common

    rows = []
    for key, s in res["summary"].items():
        spread = {
            side: f"{min(r[key] for r in res['runs'][side]):.3f}-"
            f"{max(r[key] for r in res['runs'][side]):.3f}"
            for side in ("base", "head")
        }
        rows.append(
            {
                "timed": _NAMES[key],
                f"base {res['base'][:7]}: s (median)": f"{s['base_s']:.3f}",
                "head: s (median)": f"{s['head_s']:.3f}",
                "head / base": f"{s['head_over_base']:.3f}",
                "base's runs": spread["base"],
                "head's runs": spread["head"],
            }
        )
    m = res.get("machine", {})
    flagged = disturbed(res)
    at = "" if res.get("model", "tiny") == "tiny" else f" at the {res['model']} shape"
    return (
        common.markdown_table(rows)
        + f"\n\nbench_rl's trainer (ours){at}, beta {res['beta']}, {common.cpu_label(m)}; "
        "huge pages on; "
        f"{res['pairs']} fresh processes per side in turn, each the median of "
        f"{res.get('iters', ITERS)} iterations after {WARMUP}."
        + (f" Runs without the machine to themselves: {'; '.join(flagged)}." if flagged else "")
    )


def main(argv: Sequence[str] | None = None) -> None:
    # The child runs this file as a script inside another tree, importing only that
    # tree's bench_rl: benchmarks.common (this tree's) is the parent's alone.
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="", help="the commit to compare the working tree with")
    ap.add_argument("--pairs", type=int, default=5, help="runs per side")
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--model", default="tiny", help="a bench_rl.SHAPES key: tiny, smollm2")
    ap.add_argument("--iters", type=int, default=ITERS, help="timed iterations per run")
    ap.add_argument("--out", default="runs/bench/ab_commits.json")
    ap.add_argument("--_child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._child:  # run as a script in a tree: its imports are that tree's (PYTHONPATH)
        with open(a._child, "w") as f:
            json.dump(_child(a.beta, a.model, a.iters), f)
        return
    from benchmarks import common

    if not a.base:
        ap.error("--base is required: the commit to compare the working tree with.")
    if a.pairs < 1:
        ap.error(f"--pairs={a.pairs}: give 1 or more runs per side.")
    if a.iters < 1:
        ap.error(f"--iters={a.iters}: give 1 or more timed iterations per run.")
    from benchmarks.rl_setup import SHAPES

    if a.model not in SHAPES:
        ap.error(f"--model={a.model!r}: give one of {', '.join(sorted(SHAPES))}.")
    try:
        base = resolve(a.base)
    except ValueError as e:
        ap.error(str(e))
    common.check_out(ap, a.out, "--out", is_dir=False)  # before the run
    with tempfile.TemporaryDirectory(prefix="ab_base_") as tmp:
        tree = os.path.join(tmp, "base")
        subprocess.run(
            ["git", "-C", ROOT, "worktree", "add", "--detach", "-q", tree, base], check=True
        )
        try:
            runner = functools.partial(run_tree, model=a.model, iters=a.iters)
            runs = alternate({"base": tree, "head": ROOT}, a.pairs, a.beta, runner)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], check=False)
    res = {
        "benchmark": "ab_commits",
        "base": base,
        "head": resolve("HEAD"),
        "head_dirty": bool(
            subprocess.run(
                ["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
            ).stdout.strip()
        ),
        "beta": a.beta,
        "model": a.model,
        "iters": a.iters,
        "pairs": a.pairs,
        "runs": runs,
        "summary": summarize(runs),
        "machine": common.machine_info(),
    }
    print(table_markdown(res))
    print(f"wrote {common.write_json(a.out, res)}")


if __name__ == "__main__":
    main()
