"""Synthetic tasks for CPU-scale runs, in the real record formats.

(a) tool calling over a catalogue of 8 typed functions (ToolRL verl records:
    the same loader and rewards as the real data), (b) arithmetic word
    problems with a length budget (DeepScaleR or verl records, answers in
    \\boxed{}). Prompts stay under ~100 tokens and reference answers under
    ~60 (a compact <think>), because the policies trained on them are tiny.
Deterministic given (seed, split); the test split never repeats a train request.

    python -m gdpo_jax.data.synthetic --task toolcall --out_dir data/tc --n_train 2000 --n_test 200
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Callable

from gdpo_jax.data.loaders import write_records

# name -> ordered {param: type}; a list type is an enum of strings.
CATALOGUE: dict[str, dict[str, object]] = {
    "get_weather": {"city": "str", "unit": ["celsius", "fahrenheit"]},
    "convert_currency": {"amount": "number", "from_currency": "str", "to_currency": "str"},
    "set_alarm": {"time": "str", "label": "str"},
    "send_message": {"contact": "str", "text": "str"},
    "search_flights": {"origin": "str", "destination": "str", "date": "str"},
    "get_stock_price": {"symbol": "str"},
    "translate": {"text": "str", "target_language": "str"},
    "play_music": {"artist": "str", "shuffle": "bool"},
}
_CITIES = [
    "Paris",
    "Rome",
    "Oslo",
    "Tokyo",
    "Lima",
    "Cairo",
    "Delhi",
    "Berlin",
    "Madrid",
    "Seoul",
    "Dublin",
    "Quito",
]
_CUR = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD"]
_NAMES = ["Ana", "Ben", "Chen", "Dora", "Eli", "Fay", "Gus", "Ivy", "Omar", "Zoe"]
_TEXTS = ["running late", "see you soon", "call me", "happy birthday", "on my way", "good night"]
_LABELS = ["work", "gym", "meds", "school", "bus"]
_STOCKS = ["AAPL", "MSFT", "NVDA", "TSLA", "AMZN", "GOOG"]
_PHRASES = ["good morning", "thank you", "where is the station", "how much is it", "I am hungry"]
_LANGS = ["French", "Spanish", "German", "Italian", "Japanese"]
_ARTISTS = ["Adele", "Queen", "Miles Davis", "ABBA", "Bach", "Shakira"]
_CHAT = [
    ("Hi there!", "Hello! How can I help?"),
    ("Thanks a lot!", "You are welcome."),
    ("Who are you?", "I am an assistant that can use tools."),
    ("Good night!", "Good night!"),
    ("Can you sing?", "I cannot sing, but I can play music for you."),
]


def _call(r: random.Random, name: str) -> tuple[dict, str]:
    """One (call, request text) for tool `name`."""
    c = r.choice
    if name == "get_weather":
        p = {"city": c(_CITIES), "unit": c(["celsius", "fahrenheit"])}
        t = c(
            [
                "weather in {city} in {unit}",
                "how warm is {city}, in {unit}",
                "{city} weather ({unit})",
            ]
        )
    elif name == "convert_currency":
        a, b = r.sample(_CUR, 2)
        p = {
            "amount": c([r.randint(2, 500), r.randint(2, 99) + 0.5]),
            "from_currency": a,
            "to_currency": b,
        }
        t = c(
            [
                "convert {amount} {from_currency} to {to_currency}",
                "{amount} {from_currency} in {to_currency}",
            ]
        )
    elif name == "set_alarm":
        p = {"time": f"{r.randint(5, 22):02d}:{c([0, 15, 30, 45]):02d}", "label": c(_LABELS)}
        t = c(["set an alarm at {time} for {label}", "wake me at {time}, label {label}"])
    elif name == "send_message":
        p = {"contact": c(_NAMES), "text": c(_TEXTS)}
        t = c(["text {contact}: {text}", "send {contact} the message '{text}'"])
    elif name == "search_flights":
        a, b = r.sample(_CITIES, 2)
        p = {
            "origin": a,
            "destination": b,
            "date": f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
        }
        t = c(
            [
                "flights from {origin} to {destination} on {date}",
                "fly {origin} to {destination}, {date}",
            ]
        )
    elif name == "get_stock_price":
        p = {"symbol": c(_STOCKS)}
        t = c(["price of {symbol}", "how is {symbol} trading"])
    elif name == "translate":
        p = {"text": c(_PHRASES), "target_language": c(_LANGS)}
        t = c(["translate '{text}' into {target_language}", "say '{text}' in {target_language}"])
    else:
        p = {"artist": c(_ARTISTS), "shuffle": c([True, False])}
        t = "play {artist} " + ("on shuffle" if p["shuffle"] else "in order")
    return {"name": name, "parameters": p}, t.format(**p)


def signature(name: str) -> str:
    """Compact typed signature for the system prompt, e.g. get_stock_price(symbol:str)."""
    args = ",".join(
        f"{k}:{'|'.join(v) if isinstance(v, list) else v}" for k, v in CATALOGUE[name].items()
    )
    return f"{name}({args})"


def toolcall_system_prompt(tools: list[str]) -> str:
    return (
        "Tools:\n"
        + "\n".join(signature(t) for t in tools)
        + '\nReply <think>..</think> then <tool_call> JSON lines {"name","parameters"} '
        "</tool_call> or <response>..</response>"
    )


def _toolcall_one(
    r: random.Random, split: str, i: int, n_tools: int, p_multi: float, p_none: float
) -> dict:
    u = r.random()
    if u < p_none:
        req, reply = r.choice(_CHAT)
        calls, gt = [], f"<think>no tool needed</think>\n<response>{reply}</response>"
    else:
        names = [r.choice(list(CATALOGUE))]
        if u < p_none + p_multi:  # a second call: same tool (duplicate names) or another one
            names.append(names[0] if r.random() < 0.5 else r.choice(list(CATALOGUE)))
        pairs = [_call(r, names[0])]
        for n in names[1:]:
            for _ in range(20):  # a second call must differ from the first
                pair = _call(r, n)
                if pair[0] != pairs[0][0]:
                    break
            pairs.append(pair)
        calls = [p[0] for p in pairs]
        req = " and ".join(p[1] for p in pairs)
        req = req[0].upper() + req[1:] + r.choice([".", "?", " please."])
        body = "\n".join(json.dumps(c, separators=(",", ":")) for c in calls)  # fewer tokens
        think = f"<think>use {', '.join(dict.fromkeys(names))}</think>"
        gt = f"{think}\n<tool_call>\n{body}\n</tool_call>"
    needed = list(dict.fromkeys(c["name"] for c in calls))
    others = [t for t in CATALOGUE if t not in needed]
    tools = needed + r.sample(others, max(0, n_tools - len(needed)))
    r.shuffle(tools)
    return {
        "data_source": "synthetic_toolcall",
        "prompt": [
            {"role": "system", "content": toolcall_system_prompt(tools)},
            {"role": "user", "content": req},
        ],
        "ability": "tool_call",
        "reward_model": {"style": "rule", "ground_truth": gt},
        "extra_info": {"split": split, "index": i, "tools": tools},
    }


ARITH_TEMPLATE = "{problem} Put the final answer in \\boxed{{}}."
_ITEMS = ["apples", "stickers", "marbles", "coins", "books", "pens", "cards", "shells"]
_PEOPLE = [
    ("Tom", "He"),
    ("Mia", "She"),
    ("Sam", "He"),
    ("Lea", "She"),
    ("Raj", "He"),
    ("Ada", "She"),
]


def _arith_one(
    r: random.Random, split: str, i: int, max_steps: int, max_value: int, fmt: str, max_tokens: int
) -> dict:
    name, pron = r.choice(_PEOPLE)
    item = r.choice(_ITEMS)
    x = r.randint(2, max_value)
    text, steps = [f"{name} has {x} {item}."], []
    for _ in range(r.randint(1, max_steps)):
        op = r.choice(["add", "sub", "mul"] if x > 1 else ["add", "mul"])
        if op == "add":
            b = r.randint(1, max_value)
            text.append(f"{pron} {r.choice(['buys', 'finds', 'gets'])} {b} more.")
            steps.append(f"{x}+{b}={x + b}.")
            x += b
        elif op == "sub":
            b = r.randint(1, x - 1)
            text.append(f"{pron} {r.choice(['gives away', 'loses', 'sells'])} {b}.")
            steps.append(f"{x}-{b}={x - b}.")
            x -= b
        else:
            k, b = r.randint(2, 5), r.randint(2, 9)
            text.append(f"{pron} buys {k} packs of {b} {item}.")
            steps.append(f"{k}*{b}={k * b}. {x}+{k * b}={x + k * b}.")
            x += k * b
    problem = " ".join(text) + f" How many {item} does {name} have now?"
    answer = str(x)
    solution = " ".join(steps) + f" \\boxed{{{answer}}}"
    extra = {"split": split, "index": i, "max_tokens": max_tokens}
    if fmt == "deepscaler":
        return {"problem": problem, "answer": answer, "solution": solution, "extra_info": extra}
    return {
        "data_source": "synthetic_arithmetic",
        "prompt": [{"role": "user", "content": ARITH_TEMPLATE.format(problem=problem)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": dict(extra, solution=solution),
    }


def _prompt_key(rec: dict) -> str:
    """The whole prompt (system tool list included): what a split's records differ in.

    Kept as the training split's key: changing it would change the training records.
    """
    return json.dumps(rec.get("prompt") or rec.get("problem"), sort_keys=True)


def _request_key(rec: dict) -> str:
    """The user's request alone (the last message, or a DeepScaleR problem).

    The held-out split's key: two tool-calling prompts with the same request differ
    only in the order or choice of the listed tools, and the request fixes the
    reference answer, so such a pair is the same question.
    """
    return rec["prompt"][-1]["content"] if "prompt" in rec else rec["problem"]


_KEYS: dict[str, Callable[[dict], str]] = {"prompt": _prompt_key, "request": _request_key}


def _generate(
    one: Callable,
    task: str,
    n: int,
    seed: int,
    split: str,
    exclude: set[str],
    distinct: str = "prompt",
    **kw,
) -> list[dict]:
    if distinct not in _KEYS:
        raise ValueError(f"distinct must be one of {sorted(_KEYS)}, got {distinct!r}")
    key = _KEYS[distinct]
    r = random.Random(f"gdpo-{task}-{seed}-{split}")  # str seeds hash deterministically
    out, seen, misses = [], set(exclude), 0
    while len(out) < n and misses < 2000:  # 2000 repeats in a row: the space is used up
        rec = one(r, split, len(out), **kw)
        k = key(rec)
        misses = misses + 1 if k in seen else 0
        if k not in seen:
            seen.add(k)
            out.append(rec)
    if len(out) == n:
        return out
    raise ValueError(
        f"{task}: only {len(out)} distinct records for n={n}; widen the generator "
        "(e.g. larger max_value) or ask for fewer"
    )


def toolcall_records(
    n: int,
    *,
    seed: int = 0,
    split: str = "train",
    n_tools: int = 2,
    p_multi: float = 0.25,
    p_none: float = 0.1,
    exclude: set[str] = frozenset(),
    distinct: str = "prompt",
) -> list[dict]:
    """`n` distinct ToolRL-format records (verl style).

    distinct: "prompt" (no two share the whole prompt) or "request" (no two share
    the user's request); `exclude` holds such keys not to generate.
    """
    return _generate(
        _toolcall_one,
        "toolcall",
        n,
        seed,
        split,
        set(exclude),
        distinct,
        n_tools=n_tools,
        p_multi=p_multi,
        p_none=p_none,
    )


def arithmetic_records(
    n: int,
    *,
    seed: int = 0,
    split: str = "train",
    max_steps: int = 3,
    max_value: int = 50,
    fmt: str = "verl",
    max_tokens: int = 64,
    exclude: set[str] = frozenset(),
    distinct: str = "prompt",
) -> list[dict]:
    """`n` distinct word problems; fmt "verl" (prompt baked in) or "deepscaler"
    ({problem, answer, solution}); extra_info.max_tokens records a length budget (an
    annotation: the length reward's limit is its own `max_tokens` kwarg).
    `distinct` and `exclude` as for `toolcall_records` (the same here: the prompt
    is the problem)."""
    if fmt not in ("verl", "deepscaler"):
        raise ValueError(f"fmt must be 'verl' or 'deepscaler', got {fmt!r}")
    return _generate(
        _arith_one,
        "arithmetic",
        n,
        seed,
        split,
        set(exclude),
        distinct,
        max_steps=max_steps,
        max_value=max_value,
        fmt=fmt,
        max_tokens=max_tokens,
    )


_GENERATORS = {"toolcall": toolcall_records, "arithmetic": arithmetic_records}


def make_splits(
    task: str, n_train: int, n_test: int, *, seed: int = 0, **kw
) -> dict[str, list[dict]]:
    """{"train", "test"} for task "toolcall" | "arithmetic"; test requests are unseen in train.

    The test split is distinct by the user's request and excludes every train
    request: a tool-calling prompt that repeats a train request with its tools
    listed in another order is the same question (the request fixes the answer).
    The train split stays distinct by whole prompt, as it was generated for the
    committed runs.
    """
    if task not in _GENERATORS:
        raise ValueError(f"unknown synthetic task {task!r}; choose from {sorted(_GENERATORS)}")
    gen = _GENERATORS[task]
    train = gen(n_train, seed=seed, split="train", **kw)
    seen = {_request_key(r) for r in train}
    test = gen(n_test, seed=seed, split="test", exclude=seen, distinct="request", **kw)
    return {"train": train, "test": test}


def write_synthetic(
    task: str, out_dir: str, n_train: int, n_test: int, *, seed: int = 0, fmt: str = "jsonl", **kw
) -> dict[str, str]:
    """Writes <out_dir>/train.<fmt> and test.<fmt>; returns {split: path}."""
    if fmt not in ("jsonl", "parquet"):
        raise ValueError(f"fmt must be 'jsonl' or 'parquet', got {fmt!r}")
    splits = make_splits(task, n_train, n_test, seed=seed, **kw)
    return {
        s: write_records(recs, os.path.join(out_dir, f"{s}.{fmt}")) for s, recs in splits.items()
    }


def write_samples(out_dir: str) -> list[str]:
    """(Re)writes the generated shipped samples (gdpo_jax/data/samples)."""
    pool = toolcall_records(64, seed=7, split="sample", p_multi=0.4, p_none=0.2)

    def kind(rec: dict) -> str:  # response-only / single / same tool twice / two tools
        gt = rec["reward_model"]["ground_truth"]
        names = [json.loads(x)["name"] for x in gt.split("\n") if x.startswith("{")]
        return (
            "none"
            if not names
            else "single"
            if len(names) == 1
            else "dup"
            if len(set(names)) == 1
            else "mixed"
        )

    tc = [
        r for k in ("single", "dup", "mixed", "none") for r in [x for x in pool if kind(x) == k][:2]
    ]
    ar = arithmetic_records(6, seed=7, split="sample")
    return [
        write_records(tc, os.path.join(out_dir, "toolcall_verl.jsonl")),
        write_records(tc, os.path.join(out_dir, "toolcall_verl.parquet")),
        write_records(ar, os.path.join(out_dir, "math_verl.parquet")),
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", choices=sorted(_GENERATORS), required=True)
    ap.add_argument("--out_dir", required=True)
    ap.add_argument("--n_train", type=int, default=2000)
    ap.add_argument("--n_test", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fmt", choices=["jsonl", "parquet"], default="jsonl")
    a = ap.parse_args(argv)
    for split, path in write_synthetic(
        a.task, a.out_dir, a.n_train, a.n_test, seed=a.seed, fmt=a.fmt
    ).items():
        print(f"{split}: {path}")


if __name__ == "__main__":
    main()
