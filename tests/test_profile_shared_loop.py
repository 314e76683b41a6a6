"""benchmarks/profile_shared_loop: each form's step is compared with the one loop's,
its "two_calls" form patches the name the step's forward calls, a real run of a tiny
config builds all four forms and they take the same first update, and bad arguments
stop the CLI before any run."""

from __future__ import annotations

import inspect

import pytest

from benchmarks import profile_shared_loop as S


def _fake_row(width: int) -> dict:
    def form(median: float, best: float, loss: float = 0.5, first: float = 9.0) -> dict:
        return {
            "loss": loss,
            "grad_norm": 2.0,
            "first_call_s": first,
            "median_s": median,
            "best_s": best,
        }

    return {
        "width": width,
        "steps_timed": 6,
        "forms": {
            "one_loop": form(15.0, 14.0),
            "two_calls": form(16.5, 14.7, loss=0.5 + 3e-7),
            "per_row": form(30.0, 28.0),
            "unrolled": form(13.5, 13.3, first=12.0),
        },
        "rows": 16,
        "new_tokens": 96,
        "microbatches": 2,
        "layers": 30,
    }


def test_ratios_and_table(monkeypatch):
    calls = []

    def fake(module, args, **kw):
        calls.append(args)
        return _fake_row(int(args[args.index("--widths") + 1]))

    monkeypatch.setattr(S.common, "run_child", fake)
    res = S.run("smollm2_toolcall", (240, 16), 6)
    assert [a[a.index("--widths") + 1] for a in calls] == ["240", "16"]  # one process each
    assert all(a[a.index("--forms") + 1] == ",".join(S.FORMS) for a in calls)
    f = res["results"][0]["forms"]
    # By hand: 16.5 / 15.0 = 1.10, best 14.7 / 14.0 = 1.05; 13.5 / 15.0 = 0.90.
    assert f["two_calls"]["vs_shipped"] == pytest.approx(1.1)
    assert f["two_calls"]["vs_shipped_best"] == pytest.approx(1.05)
    assert f["per_row"]["vs_shipped"] == pytest.approx(2.0)
    assert f["unrolled"]["vs_shipped"] == pytest.approx(0.9)
    assert f["one_loop"]["vs_shipped"] == 1.0
    # Starts 3.0 s slower, steps 1.5 s faster: repaid after 2 steps; the others do not
    # both start slower and step faster.
    assert f["unrolled"]["repaid_after_steps"] == pytest.approx(2.0)
    assert [f[k]["repaid_after_steps"] for k in ("one_loop", "two_calls", "per_row")] == [None] * 3
    res["machine"] = {"cpu_model": "AMD EPYC", "cpu_isa": "avx512", "cpu_usable": 2}
    table = S.table_markdown(res)
    assert (
        "| 240 | two calls | 16.50 | 14.70 | 1.10x / 1.05x | 9.0 | - | 3.0e-07 | 0.0e+00 |" in table
    )
    assert "| 16 | unrolled layers, sharing | 13.50 | 13.30 | 0.90x / 0.95x | 12.0 | 2 |" in table
    assert "AMD EPYC (avx512), 2 cores; `smollm2_toolcall`'s step (30 layers, 16 rows" in table
    lines = [line for line in table.splitlines() if line.startswith("|")]
    assert len(lines) == 2 + 2 * 4  # header, rule, one row per width and form
    assert len({line.count("|") for line in lines}) == 1  # no stray pipe in a cell


def test_the_two_calls_form_patches_the_name_the_steps_forward_calls():
    """`_steps` swaps gdpo_jax.train.completion's `shared_prompt_hidden` while the step
    traces: that is the name the log-prob forward calls, bound to prompt_sharing's."""
    from gdpo_jax.models import prompt_sharing
    from gdpo_jax.train import completion

    assert completion.shared_prompt_hidden is prompt_sharing.shared_prompt_hidden
    assert "hidden = shared_prompt_hidden(" in inspect.getsource(completion.completion_logprobs)
    assert "completion_mod.shared_prompt_hidden = functools.partial(" in inspect.getsource(S._steps)


def test_a_tiny_config_runs_every_form_to_the_same_first_update():
    """The real child on configs/tiny_cpu.py (4 layers as a scan, prompt sharing): the
    four steps run and, from the same weights, take the same first update up to f32
    sums; the forms are what they say (the per-row step shares no prompt, the unrolled
    one runs the model rebuilt without the scan)."""
    out = S._child("tiny_cpu", 8, 1)
    base = out["forms"]["one_loop"]
    assert set(out["forms"]) == set(S.FORMS)
    ran = {form: (f["scan_layers"], f["share_prompt"]) for form, f in out["forms"].items()}
    assert ran == {
        "one_loop": (True, True),
        "two_calls": (True, True),
        "per_row": (True, False),
        "unrolled": (False, True),
    }
    for form, f in out["forms"].items():
        assert f["loss"] == pytest.approx(base["loss"], rel=1e-5, abs=1e-6), form
        assert f["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-5), form
        assert f["median_s"] > 0 and f["first_call_s"] >= f["best_s"], form
    assert base["grad_norm"] > 0
    assert out["layers"] == 4 and out["width"] == 8


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--widths", "240,x"], "--widths='240,x': give comma-separated token counts"),
        (["--widths", "1"], "every width needs at least 2 tokens"),
        (["--steps", "0"], "--steps=0: time at least 1 step"),
        (["--config", "no_such_config"], "--config='no_such_config': not a configs/ file"),
        (["--widths", "4096"], "4096 is wider than the config's sampling.max_prompt_len=240"),
        (["--forms", "two_calls"], "--forms='two_calls': name one_loop (the baseline)"),
        (["--forms", "one_loop,fast"], "--forms='one_loop,fast': name one_loop (the baseline)"),
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
    assert "runs its layers unrolled: the scan forms would be two calls" in capsys.readouterr().err
