"""benchmarks/profile_remat: each policy's step over no remat's, one process per row,
the table, the remat setting reaching the trainer's config, and bad arguments stopped
before any run."""

from __future__ import annotations

import pytest

from benchmarks import profile_remat as R


def test_ratios_rows_and_table(monkeypatch):
    calls = []

    def fake(module, args, **kw):
        calls.append(args)
        return {"off_median_s": 0.60, "full_median_s": 0.66, "dots_median_s": 0.57}

    monkeypatch.setattr(R.common, "run_child", fake)
    res = R.run((4, 1), 12)
    assert all(a[a.index("--model") + 1] == "tiny" for a in calls) and res["model"] == "tiny"
    # One process per (micro-batches, layers): 4 then 1, scan then unrolled.
    got = [(a[a.index("--microbatches") + 1], a[a.index("--_layers") + 1]) for a in calls]
    assert got == [("4", "scan"), ("4", "unrolled"), ("1", "scan"), ("1", "unrolled")]
    r = res["results"][0]
    # By hand: 0.66 / 0.60 = 1.10, 0.57 / 0.60 = 0.95.
    assert (r["full_vs_off"], r["dots_vs_off"]) == (pytest.approx(1.1), pytest.approx(0.95))
    res["machine"] = {"cpu_model": "AMD EPYC", "cpu_isa": "avx512", "cpu_usable": 2}
    table = R.table_markdown(res)
    assert "| 4 | scan | 0.600 | 0.660 | 0.570 | 1.10x | 0.95x |" in table
    assert "bench_rl's `tiny` step (prompts shared, beta 0)" in table
    lines = [line for line in table.splitlines() if line.startswith("|")]
    assert len(lines) == 2 + 4 and len({line.count("|") for line in lines}) == 1


def test_each_form_reaches_the_trainers_config(monkeypatch):
    """profile_step._trainer(remat=...) sets config.model.remat and remat_policy as the
    form names them (the trainer is stopped at its construction)."""
    from benchmarks import bench_rl, profile_step
    from gdpo_jax.train import loop

    seen = []

    class Stop(Exception):
        pass

    def fake_trainer(cfg, task):
        seen.append((cfg.model.remat, cfg.model.remat_policy, cfg.algo.share_prompt))
        raise Stop

    monkeypatch.setattr(loop, "Trainer", fake_trainer)
    monkeypatch.setattr(bench_rl, "make_checkpoint", lambda *a, **k: "unused")
    for form in R.FORMS:
        with pytest.raises(Stop):
            profile_step._trainer(4, 0.0, share_prompt=True, remat=form)
    assert seen == [(False, "full", True), (True, "full", True), (True, "dots", True)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--microbatches", "4,x"], "--microbatches='4,x': give comma-separated counts"),
        (["--microbatches", "3"], "each count must divide the tiny shape's 8 prompts"),
        (["--microbatches", "0"], "each count must divide the tiny shape's 8 prompts"),
        (["--model", "smollm2", "--microbatches", "8"], "the smollm2 shape's 4 prompts"),
        (["--steps", "0"], "--steps=0: time at least 1 step"),
    ],
)
def test_bad_arguments_stop_before_any_run(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(R, "run", lambda *a, **k: pytest.fail("ran with a bad argument"))
    with pytest.raises(SystemExit) as e:
        R.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
