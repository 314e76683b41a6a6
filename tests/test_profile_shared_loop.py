"""benchmarks/profile_shared_loop: its speed-ups are the two calls' step over the one
loop's, its "two_calls" form patches the name the step's forward calls, a real run
of a tiny config builds both forms and they take the same first update, and bad
arguments stop the CLI before any run."""

from __future__ import annotations

import inspect

import pytest

from benchmarks import profile_shared_loop as S


def _fake_row(width: int) -> dict:
    first = {"loss": 0.5, "grad_norm": 2.0, "compile_s": 9.0}
    return {
        "width": width,
        "steps_timed": 6,
        "first": {"one_loop": first, "two_calls": {**first, "loss": 0.5 + 3e-7}},
        "one_loop_median_s": 15.0,
        "one_loop_best_s": 14.0,
        "two_calls_median_s": 16.5,
        "two_calls_best_s": 14.7,
        "rows": 16,
        "new_tokens": 96,
        "microbatches": 2,
        "layers": 30,
    }


def test_speedups_and_table(monkeypatch):
    calls = []

    def fake(module, args, **kw):
        calls.append(args)
        return _fake_row(int(args[args.index("--widths") + 1]))

    monkeypatch.setattr(S.common, "run_child", fake)
    res = S.run("smollm2_toolcall", (240, 16), 6)
    assert [a[a.index("--widths") + 1] for a in calls] == ["240", "16"]  # one process each
    row = res["results"][0]
    # By hand: 16.5 / 15.0 = 1.10; best 14.7 / 14.0 = 1.05.
    assert row["speedup"] == pytest.approx(1.1)
    assert row["speedup_best"] == pytest.approx(1.05)
    res["machine"] = {"cpu_model": "AMD EPYC", "cpu_isa": "avx512", "cpu_usable": 2}
    table = S.table_markdown(res)
    assert "| 240 | 16.50 | 15.00 | 1.10x / 1.05x | 3.0e-07 | 0.0e+00 |" in table
    assert "AMD EPYC (avx512), 2 cores; `smollm2_toolcall`'s step (30 layers as a scan" in table
    lines = [line for line in table.splitlines() if line.startswith("|")]
    assert len(lines) == 4  # header, rule, one row per width
    assert len({line.count("|") for line in lines}) == 1  # no stray pipe in a cell


def test_the_two_calls_form_patches_the_name_the_steps_forward_calls():
    """`_steps` swaps gdpo_jax.train.completion's `shared_prompt_hidden` while the step
    traces: that is the name the log-prob forward calls, bound to prompt_sharing's."""
    from gdpo_jax.models import prompt_sharing
    from gdpo_jax.train import completion

    assert completion.shared_prompt_hidden is prompt_sharing.shared_prompt_hidden
    assert "hidden = shared_prompt_hidden(" in inspect.getsource(completion.completion_logprobs)
    assert "completion_mod.shared_prompt_hidden = functools.partial(" in inspect.getsource(S._steps)


def test_a_tiny_config_runs_both_forms_to_the_same_first_update():
    """The real child on configs/tiny_cpu.py (4 layers as a scan, prompt sharing): both
    steps run and, from one state, take the same first update up to f32 sums."""
    out = S._child("tiny_cpu", 8, 1)
    a, b = out["first"]["one_loop"], out["first"]["two_calls"]
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    assert a["grad_norm"] > 0
    assert out["one_loop_median_s"] > 0 and out["two_calls_median_s"] > 0
    assert out["layers"] == 4 and out["width"] == 8


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--widths", "240,x"], "--widths='240,x': give comma-separated token counts"),
        (["--widths", "1"], "every width needs at least 2 tokens"),
        (["--steps", "0"], "--steps=0: time at least 1 step"),
        (["--config", "no_such_config"], "--config='no_such_config': not a configs/ file"),
        (["--widths", "4096"], "4096 is wider than the config's sampling.max_prompt_len=240"),
    ],
)
def test_bad_arguments_stop_before_any_run(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(S, "run", lambda *a, **k: pytest.fail("ran with a bad argument"))
    with pytest.raises(SystemExit) as e:
        S.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_an_unrolled_config_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(S, "run", lambda *a, **k: pytest.fail("ran with a bad argument"))
    load = S._load_config

    def unrolled(name):
        cfg = load(name)
        cfg.model.scan_layers = False
        return cfg

    monkeypatch.setattr(S, "_load_config", unrolled)
    with pytest.raises(SystemExit) as e:
        S.main(["--config", "tiny_cpu", "--widths", "8"])
    assert e.value.code == 2
    assert "runs its layers unrolled: both forms would be two calls" in capsys.readouterr().err
