"""Math task: boxed extraction, equivalence, length gating, loaders, pass@1 / Exceed."""

import json

import numpy as np
import pytest

import gdpo_jax.tasks.math as tm
from gdpo_jax.data.loaders import RecordError, sample_path, write_jsonl
from gdpo_jax.rewards import RewardRunner, RewardSpec


@pytest.mark.parametrize(
    "text, want",
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the last one
        ("\\boxed{\\left(2, 3\\right)}", "\\left(2, 3\\right)"),
        ("\\fbox{7}", "7"),
        ("the answer is \\boxed 5$", "5"),
        ("no box here", None),
        ("\\boxed{unbalanced", None),
    ],
)
def test_last_boxed(text, want):
    assert tm.last_boxed(text) == want


@pytest.mark.parametrize(
    "pred, gold, want",
    [
        ("\\frac{1}{2}", "0.5", True),
        ("0.5", "\\frac{1}{2}", True),
        ("\\dfrac{3}{4}", "0.75", True),
        ("1,000", "1000", True),
        ("1+x", "x+1", True),
        ("\\sqrt{18}", "3\\sqrt{2}", True),
        ("(2,3)", "(2, 3)", True),
        ("90^\\circ", "90", True),
        ("3", "4", False),
        ("\\frac{1}{3}", "0.33", False),
    ],
)
def test_equivalence(pred, gold, want):
    assert tm.is_equivalent(pred, gold) is want


def test_normalized_string_equality_decides_first(monkeypatch):
    # equal after normalize_answer -> equivalent without asking math-verify
    from gdpo_jax.tasks import math_verifier

    def no_verifier(*args):
        raise AssertionError("math-verify was asked")

    monkeypatch.setattr(math_verifier, "verify_bounded", no_verifier)
    assert tm.is_equivalent("\\left( 2, 3 \\right)", "(2,3)")
    assert tm.is_equivalent("\\text{Monday}.", "monday")
    with pytest.raises(AssertionError, match="math-verify was asked"):
        tm.is_equivalent("2", "3")  # not equal as strings: math-verify decides
    monkeypatch.undo()
    assert not tm.is_equivalent("2", "3")


def test_correctness_reward_branches():
    comps = [
        "\\boxed{0.5}",
        "I think it is 0.5",
        "\\boxed{3} no wait \\boxed{4}",
        "\\boxed{4}",
        "\\boxed{2}",
    ]
    gts = ["\\frac{1}{2}", "0.5", "4", "3", ["2", "two"]]
    assert tm.correctness_reward(None, comps, ground_truth=gts) == [1.0, 0.0, 1.0, 0.0, 1.0]


def test_length_conditioned_on_correctness_in_runner():
    ex = [{"prompt": "q", "ground_truth": "7"}] * 4
    comps = ["\\boxed{7}", "\\boxed{7}", "\\boxed{8}", "\\boxed{8}"]
    with RewardRunner(tm.default_rewards(max_tokens=100), num_workers=2) as r:
        R, _ = r(["q"] * 4, comps, ex, completion_lengths=[50, 150, 50, 150])
    # correct: [1, 1, 0, 0]; length raw [1, 0, 1, 0] gated by correct -> [1, 0, 0, 0]
    np.testing.assert_array_equal(R, [[1, 1], [1, 0], [0, 0], [0, 0]])
    with RewardRunner(tm.default_rewards(max_tokens=100, conditioned=False)) as r:
        R, _ = r(["q"] * 4, comps, ex, completion_lengths=[50, 150, 50, 150])
    np.testing.assert_array_equal(R[:, 1], [1, 0, 1, 0])


def test_loaders_on_shipped_samples():
    ds = tm.load(sample_path("math_deepscaler.jsonl"))
    assert len(ds) == 6 and ds[0]["ground_truth"] == "\\frac{1}{2}"
    assert ds[0]["prompt"][0]["content"].endswith("within \\boxed{}.")
    assert ds[0]["prompt"][0]["content"].startswith("What is $\\frac{3}{4}")
    vs = tm.load(sample_path("math_verl.parquet"))
    assert vs[0]["prompt"][0]["content"].endswith("Put the final answer in \\boxed{}.")
    sols = [r["extra_info"]["solution"] for r in vs]
    assert tm.correctness_reward(None, sols, ground_truth=[r["ground_truth"] for r in vs]) == [
        1.0
    ] * len(vs)
    custom = tm.load(sample_path("math_deepscaler.jsonl"), template="Q: {problem}", limit=2)
    assert len(custom) == 2 and custom[1]["prompt"][0]["content"].startswith("Q: A rectangle")


def test_malformed_math_records(tmp_path):
    p = write_jsonl(
        [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "  "}],
        tmp_path / "m.jsonl",
    )
    with pytest.raises(
        RecordError, match=r"m.jsonl, row 1, field 'answer': reference answer is empty"
    ):
        tm.load(p)
    p = write_jsonl([{"problem": "1+1?"}], tmp_path / "n.jsonl")
    with pytest.raises(RecordError, match=r"row 0, field 'answer': missing"):
        tm.load(p)
    p = write_jsonl(
        [{"prompt": [{"role": "user", "content": "x"}], "reward_model": {"style": "rule"}}],
        tmp_path / "v.jsonl",
    )
    with pytest.raises(RecordError, match="field 'answer'"):
        tm.load(p)


@pytest.mark.parametrize("answer", [{"value": 3}, [["1", "2"]], [{"v": 1}], True], ids=str)
def test_non_scalar_answer_is_rejected_with_file_row_field(tmp_path, answer):
    # Before the fix {"value": 3} loaded as the reference "{'value': 3}" (scores 0 forever).
    recs = [{"problem": "1+1?", "answer": "2"}, {"problem": "3?", "answer": answer}]
    p = write_jsonl(recs, tmp_path / "m.jsonl")
    with pytest.raises(
        RecordError, match=r"m.jsonl, row 1, field 'answer': reference answer must be text"
    ):
        tm.load(p)
    verl = [
        {"prompt": [{"role": "user", "content": "x"}], "reward_model": {"ground_truth": answer}}
    ]
    p = write_jsonl(verl, tmp_path / "v.jsonl")
    with pytest.raises(RecordError, match=r"row 0, field 'reward_model.ground_truth'"):
        tm.load(p)


def test_scalar_and_list_answers_still_load(tmp_path):
    recs = [
        {"problem": "a?", "answer": 3},
        {"problem": "b?", "answer": 0.5},
        {"problem": "c?", "answer": ["1/2", "0.5"]},
    ]
    got = [r["ground_truth"] for r in tm.load(write_jsonl(recs, tmp_path / "ok.jsonl"))]
    assert got == ["3", "0.5", ["1/2", "0.5"]]


@pytest.mark.parametrize(
    "answer,right,wrong",
    [(np.str_("12"), "12", "1"), (np.int64(5), "5", "6"), (np.float64(0.5), "0.5", "5")],
)
def test_numpy_scalar_answers_are_one_answer(answer, right, wrong):
    # A NumPy scalar has .tolist(): it used to be taken for a list, so "12" became the
    # references ["1", "2"] (a completion of 1 scored correct) and a number raised.
    (rec,) = tm.load([{"problem": "p", "answer": answer}])
    assert rec["ground_truth"] == right
    got = tm.correctness_reward(
        None, [rf"\boxed{{{right}}}", rf"\boxed{{{wrong}}}"], ground_truth=[answer, answer]
    )
    assert got == [1.0, 0.0]


def test_pass_at_1_and_exceed_by_hand():
    # problem A: 4 samples, 3 correct; problem B: 2 samples, 0 correct -> (0.75 + 0) / 2
    ex = [{"prompt": "A", "ground_truth": "1"}] * 4 + [{"prompt": "B", "ground_truth": "2"}] * 2
    comps = ["\\boxed{1}", "\\boxed{1}", "\\boxed{1}", "\\boxed{0}", "\\boxed{0}", "x"]
    out = tm.evaluate(comps, ex, completion_lengths=[10, 20, 30, 40, 50, 60], max_tokens=35)
    assert out["pass@1"] == pytest.approx(0.375)
    assert out["exceed_ratio"] == pytest.approx(3 / 6)
    assert out["num_problems"] == 2 and out["samples_per_problem"] == 3
    out = tm.evaluate(
        comps, ex, correct=[1, 1, 1, 0, 1, 1], group_ids=[0, 0, 1, 1, 2, 2], max_tokens=1
    )
    assert out["pass@1"] == pytest.approx((1 + 0.5 + 1) / 3)


def test_pass_at_k_matches_combinatorics():
    from math import comb

    for n, c, k in [(16, 3, 1), (16, 3, 4), (5, 0, 2), (5, 5, 2), (10, 8, 3)]:
        want = 1 - comb(n - c, k) / comb(n, k)
        assert tm.pass_at_k(n, c, k) == pytest.approx(want)


def test_reward_runs_in_worker_threads_without_signals():
    # math-verify's SIGALRM timeouts only work in the main thread; the reward
    # must still score in the runner's worker threads.
    ex = [{"prompt": "q", "ground_truth": json.dumps(0.5)}] * 3
    with RewardRunner(["math_correct"], num_workers=3, on_error="raise") as r:
        R, info = r(["q"] * 3, ["\\boxed{\\frac12}", "\\boxed{1/2}", "\\boxed{2}"], ex)
    np.testing.assert_array_equal(R[:, 0], [1, 1, 0])
    assert info["reward_failures/math_correct"] == 0


def test_process_executor_scores_like_threads():
    ex = [{"prompt": "q", "ground_truth": "\\frac{1}{2}"}] * 3
    comps = ["\\boxed{0.5}", "\\boxed{2}", "none"]
    scored = {}
    for executor in ("process", "thread"):
        rewards = tm.default_rewards(max_tokens=10, executor=executor)
        with RewardRunner(rewards, num_workers=2) as r:
            scored[executor] = r(["q"] * 3, comps, ex, completion_lengths=[5, 5, 5])
            assert r._executors[0] == executor  # the correctness reward's pool
    R, info = scored["process"]
    np.testing.assert_array_equal(R, [[1, 1], [0, 0], [0, 0]])
    np.testing.assert_array_equal(R, scored["thread"][0])
    assert info["reward_failures/math_correct"] == 0


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_pathological_expression_is_bounded_nan_and_counted(executor):
    # Issue #13 item 9: 9^{9^{9^{9}}} is one bigint power in C: it holds the
    # GIL, so neither math-verify's SIGALRM timeouts nor a watchdog thread can
    # stop it; it used to hang the reward worker (and the trainer) for ever.
    import time

    ex = [{"prompt": "q", "ground_truth": "1"}, {"prompt": "q", "ground_truth": "0.5"}]
    comps = ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{\\frac{2}{4}}"]
    spec = RewardSpec("math_correct", executor=executor, kwargs={"verify_timeout_s": 1.0})
    with RewardRunner([spec], num_workers=1, timeout_s=120, on_error="raise") as r:
        t0 = time.perf_counter()
        R, info = r(["q"] * 2, comps, ex)
        # 1 s deadline + helper (re)starts (~3 s each on a busy 2-core machine).
        assert time.perf_counter() - t0 < 60
    assert np.isnan(R[0, 0]) and R[1, 0] == 1
    assert info["reward_timeouts/math_correct"] == 1
    assert info["reward_failures/math_correct"] == 0
    with pytest.raises(tm.RewardTimeouts) as e:
        tm.correctness_reward(None, comps[:1], ground_truth=["1"], verify_timeout_s=1.0)
    assert e.value.timed_out == [0]
    res = tm.evaluate(comps, ex, completion_lengths=[5, 5])  # NaN left out of pass@1
    assert res["pass@1"] == 1.0


def test_slow_comparisons_stop_at_the_runners_deadline_not_the_chunk(monkeypatch):
    # Six slow comparisons in one chunk spent the runner's whole call (math_correct took
    # no deadline): the runner failed the chunk, its correct answers too, and with
    # on_error="raise" stopped the run. A comparison is faked here: "slow" takes its
    # whole budget, then times out, as the helper process does.
    import time

    from gdpo_jax.tasks import math_verifier

    budgets = []

    def fake_verify(pred, gold, timeout_s, deadline=None):
        budgets.append(timeout_s)
        if pred == "slow":
            time.sleep(timeout_s)
            raise TimeoutError("slow")
        return False

    monkeypatch.setattr(math_verifier, "verify_bounded", fake_verify)
    comps = ["\\boxed{slow}"] * 6 + ["\\boxed{3}", "\\boxed{4}"]
    ex = [{"prompt": "q", "ground_truth": "3"}] * 8
    spec = RewardSpec("math_correct", kwargs={"verify_timeout_s": 1.0})
    with RewardRunner([spec], num_workers=1, timeout_s=3.0, on_error="raise") as r:
        t0 = time.monotonic()
        R, info = r(["q"] * 8, comps, ex)
        took = time.monotonic() - t0
    assert took < 3.0  # inside the runner's deadline (start + 3 s - 0.3 s)
    assert np.isnan(R[:6, 0]).all() and R[6, 0] == 1.0  # equal after normalizing: scored
    # "4" is checked only while time is left; past the deadline it is NaN, not a guess.
    assert R[7, 0] == 0.0 or np.isnan(R[7, 0])
    assert info["reward_timeouts/math_correct"] == int(np.isnan(R[:, 0]).sum())
    assert info["reward_failures/math_correct"] == 0
    assert all(b <= 1.0 for b in budgets) and min(budgets) < 1.0  # the deadline's remainder


def test_arrows_are_not_left_right_delimiters():
    """The string fallback drops \\left / \\right delimiters but not the arrows that begin
    with those words: \\leftarrow and \\rightarrow both became 'arrow' and matched."""
    assert tm.normalize_answer(r"\left(1, 2\right)") == "(1,2)"
    assert tm.normalize_answer(r"\leftarrow") != tm.normalize_answer(r"\rightarrow")
    got = tm.correctness_reward(None, [r"so \boxed{\leftarrow}"], ground_truth=[r"\rightarrow"])
    assert got == [0.0]
    assert tm.correctness_reward(None, [r"\boxed{\rightarrow}"], ground_truth=[r"\rightarrow"]) == [
        1.0
    ]


@pytest.mark.parametrize(
    "gold,written,text",
    [(0.00001, r"\boxed{0.00001}", "0.00001"), (1e20, r"\boxed{100000000000000000000}", None)],
)
def test_numeric_references_are_written_out(gold, written, text):
    """A numeric reference answer becomes positional text: str(1e-05) is '1e-05', which
    no written answer matched."""
    rec = tm.normalize_record({"problem": "p", "answer": gold}, "<mem>", 0)
    assert "e" not in rec["ground_truth"].lower()
    if text is not None:
        assert rec["ground_truth"] == text
    assert tm.correctness_reward(None, [written], ground_truth=[rec["ground_truth"]]) == [1.0]


def test_unwrap_text_is_the_regex_it_replaces():
    """unwrap_text replaced the text-wrapper regex (written out below): the same
    result on random strings of openers, braces and newlines."""
    import random
    import re

    old = re.compile(r"\\text\{(.*?)\}|\\mathrm\{(.*?)\}")
    rng = random.Random(0)
    parts = ["\\text{", "\\mathrm{", "}", "\n", "a", "b", " ", "{", "\\", "text"]
    for _ in range(20000):
        s = "".join(rng.choice(parts) for _ in range(rng.randint(0, 14)))
        want = old.sub(lambda m: m.group(1) or m.group(2) or "", s)
        assert tm.unwrap_text(s) == want, repr(s)


@pytest.mark.parametrize(
    "answer",
    [
        "\\text{" * 300_000 + "\n" + "}" * 300_001,  # no `}` on the openers' line
        # Linear for the regex too; quadratic for a rewrite that looked for each opener's
        # `}` from scratch (each one far past its newline).
        "\\text{\n" * 300_000 + "}",
    ],
)
def test_a_pathological_boxed_answer_is_normalized_in_linear_time(answer):
    """The text-wrapper regex took quadratic time in the answer (48 KB: 2 s in the reward
    thread, GIL held, outside every timeout; 2 MB would be an hour). A subprocess, so a
    regression fails on the timeout instead of hanging the suite."""
    from tests._subprocess import run_python

    code = (
        "import sys, gdpo_jax.tasks.math as tm; print(len(tm.normalize_answer(sys.stdin.read())))"  # noqa: E501
    )
    proc = run_python(code, stdin=answer)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout) > 0


def test_the_verifier_helpers_start_up_counts_against_the_calls_deadline(monkeypatch):
    """A helper killed at a timeout was restarted (1.5-2.5 s of imports) outside every
    budget: a chunk of slow answers ran past the runner's timeout, which scored all of
    it NaN, right answers too. Under a deadline the start-up counts: an answer waiting
    on a helper still starting at the deadline is NaN on time, and the helper is kept
    for the next call; a timed-out helper's replacement starts at once."""
    import sys
    import time

    from gdpo_jax.tasks import math_verifier

    slow = "import time, runpy; time.sleep(4); runpy.run_module('gdpo_jax.tasks.math_verifier', run_name='__main__')"  # noqa: E501
    monkeypatch.setattr(math_verifier, "_COMMAND", (sys.executable, "-c", slow))
    monkeypatch.setattr(math_verifier, "_LOCAL", __import__("threading").local())
    t0 = time.monotonic()
    with pytest.raises(tm.RewardTimeouts) as e:  # 1 + x = x + 1 needs math-verify
        tm.correctness_reward(None, ["\\boxed{1 + x}"], ground_truth=["x+1"], deadline=t0 + 1.0)
    elapsed = time.monotonic() - t0
    assert np.isnan(e.value.values[0]) and elapsed < 3.0, elapsed  # not the 4 s start-up
    helper = math_verifier._LOCAL.helper
    assert helper.proc.poll() is None and not helper.ready  # kept, still starting
    assert tm.correctness_reward(None, ["\\boxed{1 + x}"], ground_truth=["x+1"]) == [1.0]
    assert math_verifier._LOCAL.helper is helper and helper.ready  # the same one, now ready
    # A comparison past its budget: the replacement helper is started right away.
    with pytest.raises(TimeoutError):
        math_verifier.verify_bounded("9^{9^{9^{9}}}", "1", 0.5)
    replacement = math_verifier._LOCAL.helper
    assert replacement is not helper and replacement.proc.poll() is None
    assert helper.proc.poll() is not None  # the slow one was killed
    replacement.kill()
