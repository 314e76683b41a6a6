"""benchmarks.ab_commits: the order of its runs, its medians and table, its refusals,
and one real run of its child in a tree."""

from __future__ import annotations

import os
import subprocess

import pytest

from benchmarks import ab_commits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_runs_alternate_and_swap_the_first_side_every_pair():
    """Each side runs `pairs` times in turn, and the side that goes first swaps every
    pair, so a slow spell of the machine falls on both sides."""
    order = []

    def runner(tree: str, beta: float) -> dict[str, float]:
        order.append((tree, beta))
        return {k: 1.0 for k in ab_commits.SERIES}

    runs = ab_commits.alternate({"base": "/b", "head": "/h"}, 3, 0.04, runner)
    assert order == [
        ("/b", 0.04),
        ("/h", 0.04),
        ("/h", 0.04),
        ("/b", 0.04),
        ("/b", 0.04),
        ("/h", 0.04),
    ]
    assert [len(runs["base"]), len(runs["head"])] == [3, 3]
    # Each run keeps the machine's activity around it (common.host_activity's record).
    for run in runs["base"] + runs["head"]:
        assert run["iter_s"] == 1.0 and {"other_cpu_frac", "huge_page_fallbacks"} <= set(
            run["host"]
        )


def test_summary_is_each_sides_median_and_the_ratio_and_the_table_shows_them():
    runs = {
        "base": [{"iter_s": v, "sample_s": 0.3, "step_s": 0.5} for v in (0.80, 0.90, 0.84)],
        "head": [{"iter_s": v, "sample_s": 0.3, "step_s": 0.6} for v in (0.83, 0.70, 0.99)],
    }
    s = ab_commits.summarize(runs)
    assert s["iter_s"] == {"base_s": 0.84, "head_s": 0.83, "head_over_base": 0.83 / 0.84}
    assert s["step_s"]["head_over_base"] == pytest.approx(1.2)
    res = {"base": "4338de7abc", "beta": 0.0, "pairs": 3, "runs": runs, "summary": s}
    res["machine"] = {"cpu_model": "AMD EPYC", "cpu_isa": "avx512", "cpu_usable": 2}
    table = ab_commits.table_markdown(res)
    assert "| RL iteration | 0.840 | 0.830 | 0.988 | 0.800-0.900 | 0.700-0.990 |" in table
    assert "| step | 0.500 | 0.600 | 1.200 |" in table
    assert "base 4338de7: s (median)" in table and "3 fresh processes per side" in table
    assert "(ours), beta 0.0" in table and "median of 12 iterations after 2" in table
    smol = dict(res, model="smollm2", iters=4)
    assert "(ours) at the smollm2 shape, beta" in ab_commits.table_markdown(smol)
    assert "median of 4 iterations after 2" in ab_commits.table_markdown(smol)
    # Runs recorded without host activity (the committed 8-pair run), or on a quiet
    # machine, add nothing under the table; a loaded run or huge pages that fell back do.
    assert "without the machine" not in table and ab_commits.disturbed(res) == []
    quiet = {"other_cpu_frac": 0.01, "huge_page_fallbacks": 0, "compaction_stalls": 0}
    for side in ("base", "head"):
        for run in runs[side]:
            run["host"] = dict(quiet)
    assert "without the machine" not in ab_commits.table_markdown(res)
    runs["base"][1]["host"].update(other_cpu_frac=0.12, huge_page_fallbacks=3)
    runs["head"][2]["host"]["compaction_stalls"] = 1
    assert ab_commits.table_markdown(res).endswith(
        "Runs without the machine to themselves: base run 2: 12% other CPU, "
        "3 huge page fallbacks; head run 3: 1 compaction stalls."
    )


def test_refusals_name_the_flag_before_any_run(monkeypatch, capsys):
    """An unknown commit and a pair count under 1 are one line each, before a worktree
    or a run exists."""
    monkeypatch.setattr(ab_commits, "alternate", lambda *a, **k: pytest.fail("ran"))
    for argv, says in (
        ([], "--base is required"),
        (["--base", "no-such-ref-x"], "--base='no-such-ref-x' is not a commit"),
        (["--base", "HEAD", "--pairs", "0"], "--pairs=0: give 1 or more"),
        (["--base", "HEAD", "--iters", "0"], "--iters=0: give 1 or more"),
        (["--base", "HEAD", "--model", "llama"], "--model='llama': give one of smollm2, tiny"),
    ):
        with pytest.raises(SystemExit) as e:
            ab_commits.main(argv)
        assert e.value.code == 2 and says in capsys.readouterr().err
    with pytest.raises(ValueError, match="give a hash or a ref"):
        ab_commits.resolve("no-such-ref-x")
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
    assert ab_commits.resolve("HEAD") == head.stdout.strip()


def test_the_child_times_the_tree_on_its_path(tmp_path):
    """The child, run as the parent runs it (`run_tree`: a script, the tree as cwd and PYTHONPATH),
    writes the medians of bench_rl's series; bench_ours is shortened to 1 + 1 iterations
    through a stand-in bench_rl placed first in the tree."""
    tree = tmp_path / "tree"
    (tree / "benchmarks").mkdir(parents=True)
    (tree / "benchmarks" / "__init__.py").write_text("")
    (tree / "benchmarks" / "bench_rl.py").write_text(
        "TINY = 'tiny'\n"
        "SHAPES = {'tiny': TINY, 'smollm2': 'smol'}\n"
        "def make_checkpoint(d, shape):\n"
        "    assert shape in SHAPES.values()\n"
        "    return d\n"
        "def bench_ours(ckpt, beta, *, warmup, iters, shape='tiny'):\n"
        "    assert (warmup, iters) == (2, 12 if shape == 'tiny' else 3)\n"
        "    return {'iter_s': [1.0, 3.0, beta], 'sample_s': [0.1], 'step_s': [0.2, 0.4],\n"
        "            'compiles': 1, 'shape': shape}\n"
    )
    got = ab_commits.run_tree(str(tree), 2.0)
    assert got == {"iter_s": 2.0, "sample_s": 0.1, "step_s": pytest.approx(0.3)}
    # --model and --iters reach bench_ours (a wrong pair fails its assertion).
    got = ab_commits.run_tree(str(tree), 5.0, model="smollm2", iters=3)
    assert got["iter_s"] == 3.0
    with pytest.raises(RuntimeError, match="AssertionError"):
        ab_commits.run_tree(str(tree), 5.0, model="smollm2", iters=12)
