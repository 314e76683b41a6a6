"""Tool-calling rewards on hand-worked cases, loader, BFCL-style evaluation."""

import json

import pytest

from gdpo_jax.data.loaders import RecordError, sample_path, write_jsonl
from gdpo_jax.tasks import toolcall as tc


def call(name, **params):
    return json.dumps({"name": name, "parameters": params})


def block(*calls, think="t", response=None):
    s = f"<think>{think}</think>\n"
    if calls:
        s += "<tool_call>\n" + "\n".join(calls) + "\n</tool_call>"
    if response is not None:
        s += ("\n" if calls else "") + f"<response>{response}</response>"
    return s


def correctness(completion, gt):
    return tc.correctness_reward(None, [completion], ground_truth=[gt])[0]


def fmt(completion, gt):
    return tc.format_reward(None, [completion], ground_truth=[gt])[0]


W_PAR = call("get_weather", city="Paris", unit="c")
W_ROME = call("get_weather", city="Rome", unit="c")
W_OSLO = call("get_weather", city="Oslo", unit="f")


def test_match_score_by_hand():
    assert tc.match_score([], []) == 1.0
    assert tc.match_score(["a"], []) == 0.0
    assert tc.match_score(["a", "a", "b"], ["a", "b", "b"]) == pytest.approx(
        2 / 4
    )  # inter 2, union 4
    assert tc.match_score(["a", "b"], ["b", "a"]) == 1.0


def test_exact_match_is_3():
    gt = block(W_PAR)
    assert correctness(block(W_PAR, think="other thoughts"), gt) == 3.0
    # 20 == 20.0 in JSON-decoded Python, so this is an exact match too
    assert correctness(block(call("f", x=20.0)), block(call("f", x=20))) == 3.0


def test_duplicate_names_partial_greedy_by_hand():
    # gt [P(Paris,c), R(Rome,c)], pred [R(Rome,c), O(Oslo,f)]; names equal -> 1.
    # gt P: pred R scores keys 1 + unit 1 = 2 (beats O: 1 + 0) -> used.
    # gt R: only O left: 1 + 0 = 1.  score 1 + 2 + 1 = 4, max 1 + 3 + 3 = 7.
    # (an optimal assignment would give 5: ToolRL's greedy order matters)
    got = correctness(block(W_ROME, W_OSLO), block(W_PAR, W_ROME))
    assert got == pytest.approx(6 * 4 / 7 - 3)


def test_partial_names_and_params_by_hand():
    # names [f, g] vs [f, h]: 1/3; f matches fully (1 + 1); max 1 + 2 + 2 = 5
    got = correctness(block(call("f", a=1), call("h", c=3)), block(call("f", a=1), call("g", b=2)))
    assert got == pytest.approx(6 * (1 / 3 + 2) / 5 - 3)
    # keys [a, b] vs [a, c]: 1/3, value a ok: score 1 + 1/3 + 1, max 4 -> 0.5
    assert correctness(block(call("f", a=1, c=5)), block(call("f", a=1, b=2))) == pytest.approx(0.5)
    # typed values: "20" != 20 -> keys 1, values 0: score 2 of 3 -> 1.0
    assert correctness(block(call("f", x="20")), block(call("f", x=20))) == pytest.approx(1.0)
    # no-arg calls: [f(), g()] vs [f()]: names 1/2, f keys [] == [] -> 1; max 3 -> 0
    assert correctness(block(call("f")), block(call("f"), call("g"))) == pytest.approx(0.0)


def test_reordered_calls_score_full_but_are_not_exact():
    gt = block(W_PAR, W_ROME)
    assert correctness(block(W_ROME, W_PAR), gt) == pytest.approx(3.0)


def test_parse_failures_are_minus_3():
    gt = block(W_PAR)
    assert correctness("<think>t</think>\n<response>hi</response>", gt) == -3.0  # no call block
    assert correctness(block("{not json}"), gt) == -3.0
    assert correctness(block('{"name": "get_weather", "args": {}}'), gt) == -3.0  # no parameters
    assert correctness(block('{"name": ["x"], "parameters": {}}'), gt) == -3.0
    assert correctness(block(W_PAR, "", W_ROME), gt) == -3.0  # blank line inside the block


def test_no_tool_call_expected_is_0():
    gt = block(response="Hello!")
    assert correctness(block(W_PAR), gt) == 0.0
    assert correctness("garbage", gt) == 0.0


@pytest.mark.parametrize(
    "completion, gt, want",
    [
        (block(W_PAR), block(W_PAR), 1.0),
        (block(W_PAR) + "\n\n", block(W_PAR), 1.0),  # trailing whitespace is stripped
        (
            "<tool_call>\n" + W_PAR + "\n</tool_call>\n<think>t</think>",
            block(W_PAR),
            0.0,
        ),  # wrong order
        ("Sure! " + block(W_PAR), block(W_PAR), 0.0),  # extra text before
        (block(W_PAR) + " done", block(W_PAR), 0.0),  # extra text after
        (
            "<think>t</think><tool_call>\n" + W_PAR + "\n</tool_call>",
            block(W_PAR),
            0.0,
        ),  # no newline
        (
            "<think>a</think>\n<think>b</think>\n<tool_call>\n" + W_PAR + "\n</tool_call>",
            block(W_PAR),
            0.0,
        ),
        (block(response="hi"), block(response="yo"), 1.0),  # response only
        (
            "<think><tool_call></think>\n<response>hi</response>",
            block(response="x"),
            0.0,
        ),  # stray tag
        (block(response="hi"), block(W_PAR), 0.0),  # reply where a call is expected
        (block(W_PAR, response="ok"), block(W_PAR, response="done"), 1.0),  # call then response
        (block(W_PAR), block(W_PAR, response="done"), 0.0),  # response missing
        ("<think>only</think>", "<think>x</think>", 1.0),  # neither expected
    ],
)
def test_format_reward(completion, gt, want):
    assert fmt(completion, gt) == want


def test_ast_accuracy_and_evaluate():
    gt2 = block(W_PAR, W_ROME)
    # order-free, strings compared loosely (case), numbers by value
    assert tc.ast_match(block(call("get_weather", city="rome", unit="C"), W_PAR), gt2)
    assert not tc.ast_match(block(W_PAR), gt2)  # a call missing
    assert not tc.ast_match(block(W_PAR, W_ROME, W_OSLO), gt2)  # an extra call
    assert tc.ast_match(block(call("f", x=2.0)), block(call("f", x=2)))
    assert tc.ast_match(block(response="hi"), block(response="x"))  # relevance: no call
    assert not tc.ast_match(block(W_PAR), block(response="x"))
    ex = [{"ground_truth": gt2}, {"ground_truth": block(W_PAR)}]
    out = tc.evaluate([gt2, "junk"], ex)
    assert out == {"accuracy": 0.5, "format": 0.5, "correctness": 0.0, "num_samples": 2.0}


def test_loader_on_shipped_samples():
    recs = tc.load(sample_path("toolcall_verl.jsonl"))
    assert recs == tc.load(sample_path("toolcall_verl.parquet"))
    assert len(recs) == 8
    for r in recs:
        assert r["prompt"][0]["role"] == "system" and r["prompt"][-1]["role"] == "user"
        assert fmt(r["ground_truth"], r["ground_truth"]) == 1.0
        want = 3.0 if "<tool_call>" in r["ground_truth"] else 0.0
        assert correctness(r["ground_truth"], r["ground_truth"]) == want
    assert any("<response>" in r["ground_truth"] for r in recs)


def test_loader_via_datasets_backend():
    assert tc.load(sample_path("toolcall_verl.parquet"), backend="datasets", limit=3) == tc.load(
        sample_path("toolcall_verl.jsonl"), limit=3
    )


def test_malformed_records_name_file_row_field(tmp_path):
    good = json.loads(open(sample_path("toolcall_verl.jsonl")).readline())
    no_gt = dict(good, reward_model={"style": "rule"})
    bad_call = dict(
        good, reward_model={"ground_truth": "<think>x</think>\n<tool_call>\n{oops}\n</tool_call>"}
    )
    bad_prompt = dict(good, prompt=[{"role": "user"}])
    for i, rec in enumerate([no_gt, bad_call]):
        p = write_jsonl([good, rec], tmp_path / f"bad{i}.jsonl")
        with pytest.raises(RecordError) as ei:
            tc.load(p)
        assert str(p) in str(ei.value) and "row 1" in str(ei.value)
        assert ei.value.row == 1
    p = write_jsonl([good, good, bad_prompt], tmp_path / "bad_prompt.jsonl")
    with pytest.raises(RecordError, match=r"row 2, field 'prompt\[0\]'"):
        tc.load(p)
    with pytest.raises(RecordError, match="field 'answer'"):  # no ground truth anywhere
        tc.load([{"prompt": "hi"}])
    (tmp_path / "broken.jsonl").write_text(json.dumps(good) + "\n{broken\n")
    with pytest.raises(RecordError, match=r"broken.jsonl, row 1: invalid JSON"):
        tc.load(tmp_path / "broken.jsonl")


def test_ast_match_keeps_booleans_apart_from_numbers():
    """BFCL's checker rejects an int where a boolean is expected: True == 1.0 and
    hash(True) == hash(1.0), so untagged bools compared equal to 1."""
    call = '{"name": "play", "parameters": {"artist": "X", "shuffle": true}}'
    gt = f"<tool_call>\n{call}\n</tool_call>"
    pred = gt.replace("true", "1")
    assert not tc.ast_match("<think>a</think>\n" + pred, gt)
    assert tc.ast_match("<think>a</think>\n" + gt, gt)
    assert tc._norm_value({"n": 5}) == tc._norm_value({"n": 5.0})  # numbers by value still


def test_ast_match_keeps_an_object_apart_from_a_list_of_pairs():
    """An object argument and a list of [key, value] pairs are different JSON: their
    normalized forms were one tuple of pairs, so either matched the other."""
    gt = '<tool_call>\n{"name": "f", "parameters": {"opts": {"a": 1, "b": "x"}}}\n</tool_call>'
    pred = gt.replace('{"a": 1, "b": "x"}', '[["a", 1], ["b", "x"]]')
    assert not tc.ast_match("<think>a</think>\n" + pred, gt)
    assert not tc.ast_match("<think>a</think>\n" + gt, pred)
    reordered = gt.replace('{"a": 1, "b": "x"}', '{"b": "X", "a": 1.0}')
    assert tc.ast_match("<think>a</think>\n" + reordered, gt)  # key order, case, 1 == 1.0


@pytest.mark.parametrize(
    "line",
    [
        '{"name": "f", "parameters": {"a": ' + "9" * 5000 + "}}",  # int() refuses > 4300 digits
        "[" * 1000,  # unclosed: json recurses once per bracket
        '{"name": "f", "parameters": ' + '{"a": ' * 1000 + "1" + "}" * 1000 + "}",
    ],
)
def test_json_a_model_can_write_scores_unparsable_not_a_crash(line):
    # json.loads raises ValueError and RecursionError besides JSONDecodeError: the reward
    # raised (the runner stopped the run) and the eval crashed whatever on_error said.
    gt = block(call("f", a=1))
    completion = f"<think>t</think>\n<tool_call>\n{line}\n</tool_call>"
    assert tc.parse_tool_calls(completion) is None
    assert correctness(completion, gt) == -3.0
    assert not tc.ast_match(completion, gt)
    assert tc.evaluate([completion], [{"ground_truth": gt}])["accuracy"] == 0.0


def test_deeply_nested_parameters_are_unparsable_at_any_stack_depth():
    """600 levels parse (json.loads allows ~1000 less the caller's stack) but normalizing
    them took two frames a level: RecursionError in the held-out eval, which ended the
    run. And json.loads' limit depends on the caller's stack: 990 levels scored 1.5
    called directly and -3 under the RewardRunner. Past MAX_NESTING a call is unparsable,
    wherever it is scored; at the limit it parses."""

    def at_depth(frames, fn):  # fn called under `frames` more stack frames
        return fn() if frames == 0 else at_depth(frames - 1, fn)

    gt = block(call("f", a=1))
    limit = tc.MAX_NESTING - 2  # the call's dict and its parameters are two levels
    for depth in (600, 990, limit + 1, limit):
        for nested in ("[" * depth + "1" + "]" * depth, '{"b": ' * depth + "1" + "}" * depth):
            line = '{"name": "f", "parameters": {"a": ' + nested + "}}"
            pred = f"<think>t</think>\n<tool_call>\n{line}\n</tool_call>"
            fits = depth <= limit
            assert (tc.parse_tool_calls(pred) is not None) == fits, depth
            scores = {at_depth(n, lambda p=pred: correctness(p, gt)) for n in (0, 400)}
            assert len(scores) == 1 and (scores.pop() == -3.0) != fits, depth
            assert not tc.ast_match(pred, gt)
            assert tc.evaluate([pred], [{"ground_truth": gt}])["accuracy"] == 0.0


def test_huge_integer_values_compare_without_overflow():
    # float() of a 310-digit int raised OverflowError in the eval's value normalizer.
    big = 10**400
    gt = block(call("f", a=1))
    pred = block(call("f", a=big))
    assert correctness(pred, gt) == pytest.approx(6 * 2 / 3 - 3)  # names and keys, not values
    assert not tc.ast_match(pred, gt)
    assert tc.ast_match(pred, pred)
    assert tc.evaluate([pred], [{"ground_truth": gt}])["accuracy"] == 0.0
