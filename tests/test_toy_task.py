"""The toy tool-calling task's splits, as its docstring and docs/tasks-and-rewards.md say."""

from __future__ import annotations

from gdpo_jax.tasks.toy import records


def _triples(split: str, n: int) -> list[tuple[str, str, str]]:
    return [(r["tool"], *r["args"]) for r in records(n, seed=0, split=split)]


def test_the_toy_test_split_holds_out_ordered_triples():
    train, test = set(_triples("train", 8000)), set(_triples("test", 2000))
    assert len(test) == 441 and len(train) == 3975  # the whole pool, split 1:9
    assert not train & test
    # Unordered, the splits overlap: the documented 91 % of the test triples are a
    # train triple with its arguments swapped.
    swapped = sum((t, b, a) in train for t, a, b in test) / len(test)
    assert round(swapped, 2) == 0.91
