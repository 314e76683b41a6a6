"""One try's prompts through the Sampler and the RewardRunner: chunked
generation (fixed-shape sampler calls), prompt-width bucketing and left padding,
and reward scoring in a background thread that overlaps the next chunk's decode.
`rollout.collect_batch` builds a full (dynamically sampled) batch from these.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from gdpo_jax.rewards.runner import RewardError
from gdpo_jax.train.distributed import any_process


def _used_width(mask: np.ndarray) -> int:
    """Columns from the first nonzero one of any row of a left-padded mask [N, P]."""
    cols = np.flatnonzero(np.asarray(mask).any(axis=0))
    return int(mask.shape[1] - cols[0]) if cols.size else 1


def prompt_width(longest: int, max_prompt_len: int, buckets: Sequence[int] = ()) -> int:
    """The batch's prompt width: the smallest bucket >= longest (max_prompt_len
    without buckets). Few widths = few compilations of the step."""
    if longest > max_prompt_len:
        raise ValueError(
            f"a prompt of {longest} tokens exceeds sampling.max_prompt_len={max_prompt_len}; "
            "raise --config.sampling.max_prompt_len or drop long prompts from the data."
        )
    for b in buckets:
        if longest <= b:
            return int(b)
    return int(max_prompt_len)


def _pad_left(x: np.ndarray, width: int, value: int) -> np.ndarray:
    """Left pads x [N, P] to [N, width]; a wider x loses its leftmost columns,
    which callers guarantee are padding (width >= `_used_width` of the mask)."""
    if x.shape[1] >= width:
        return np.ascontiguousarray(x[:, x.shape[1] - width :])
    out = np.full((x.shape[0], width), value, x.dtype)
    out[:, width - x.shape[1] :] = x
    return out


def _generate_chunked(
    sampler: Any,
    prompts: list,
    params: Any,
    *,
    group_size: int,
    key: jax.Array,
    chat_template: bool,
    prompts_per_call: int,
    on_chunk: Callable[[int, Any], None] | None = None,
    first_row: int | None = None,
) -> dict[str, Any]:
    """Sampler.generate over consecutive chunks of `prompts_per_call` prompts.

    on_chunk(start, rollouts): called after each chunk is generated, before
    the next one starts (the reward overlap hook of `sample_and_score`).

    Bounds the rows one decode holds (KV cache: k and v, L x rows x Hkv x S x Dh each) so a
    paper-size rollout batch (e.g. 8192 rows x 8000 tokens) fits. One chunk
    (prompts_per_call 0 or >= len(prompts)) is a single call. Every chunk uses
    `key`, and its rows' ids (their random streams) continue the previous
    chunks' from first_row, this process's first row in the whole batch
    (`Sampler.generate(first_row=...)`), so the chunks sample what one call over
    the whole batch would, in any number of processes. first_row None: the
    Sampler's default (one call, or one process). With several processes every
    process passes the same number of prompts, hence makes the same number of
    (collective) calls.
    Returns the Rollouts fields concatenated over chunks (group ids offset to
    index `prompts`), with "prompt_ids"/"prompt_mask" as lists of per-chunk
    arrays (each chunk has its own prompt bucket width).
    """
    n = len(prompts)
    per = n if prompts_per_call <= 0 else min(int(prompts_per_call), n)
    chunks = [(i, prompts[i : i + per]) for i in range(0, n, per)] if n else [(0, [])]
    if first_row is None and len(chunks) > 1:
        if jax.process_count() > 1:  # each call's default would restart the ids
            raise ValueError(
                "chunked generation over several processes needs first_row, this "
                "process's first row in the whole batch (e.g. its first prompt x group_size)."
            )
        first_row = 0
    outs = []
    for start, part in chunks:
        ro = sampler.generate(
            part,
            params,
            num_generations=group_size,
            key=key,
            chat_template=chat_template,
            first_row=first_row,
        )
        if first_row is not None:
            first_row += len(part) * group_size  # real rows: batch padding takes no id
        outs.append((start, ro))
        if on_chunk is not None:
            on_chunk(start, ro)
    cat = lambda f: np.concatenate([np.asarray(getattr(ro, f)) for _, ro in outs])  # noqa: E731
    return {
        "prompt_ids": [ro.prompt_ids for _, ro in outs],
        "prompt_mask": [ro.prompt_mask for _, ro in outs],
        "completion_ids": cat("completion_ids"),
        "completion_mask": cat("completion_mask"),
        "logprobs": cat("logprobs"),
        "lengths": cat("lengths"),
        "group_ids": np.concatenate([start + np.asarray(ro.group_ids) for start, ro in outs]),
        "texts": [t for _, ro in outs for t in ro.texts],
        "finish_reason": [f for _, ro in outs for f in ro.finish_reason],
        "num_calls": len(outs),
    }


def _agree_on_scoring(failure: Exception | None) -> None:
    """Raises on every process when scoring failed on any (every sampler collective is
    done by then): a process whose rewards raised (`rewards.on_error="raise"`) used to
    stop alone while the others waited in the next collective, and none ever ended."""
    if jax.process_count() > 1:
        if any_process(failure is not None) and failure is None:
            raise RewardError(
                "reward scoring (or the batch's prompt width) failed on another process (see "
                "its log for the reward and the sample); every process stops with it.",
                reward="(another process)",
            )
    if failure is not None:
        raise failure


def sample_and_score(
    records: list[dict],
    *,
    sampler: Any,
    runner: Callable,
    params: Any,
    group_size: int,
    key: jax.Array,
    max_prompt_len: int,
    pad_id: int,
    chat_template: bool = True,
    prompts_per_call: int = 0,
    prompt_buckets: Sequence[int] = (),
    overlap_rewards: bool = False,
    first_row: int | None = None,
) -> dict[str, Any]:
    """Generates G completions for each record and scores them. Host NumPy out.

    prompts_per_call: this process's prompts per Sampler.generate call (0 =
    all in one call).
    first_row: the id of this process's first row in the whole batch (the
    rows' random streams, `_generate_chunked`); needed for chunked calls over
    several processes.
    overlap_rewards: score each chunk's rows on a background thread while the
    next chunk generates (slow rewards hide behind decoding); the runner is
    per row, so the rewards equal scoring all rows at once after the last
    chunk (overlap_rewards=False, or a single chunk).
    prompt_buckets: prompt widths (ascending); the prompts are left padded to
    the bucket of the widest chunk. () = always max_prompt_len.
    Returns a dict with the batch arrays (rows = len(records) * G), "texts",
    "finish", "sample_s" (generation), "reward_s" (summed runner calls),
    "reward_wait_s" (reward time not hidden behind generation), "reward_info",
    "sample_calls".
    """
    t0 = time.perf_counter()
    prompts = [r["prompt"] for r in records]
    reward_s = [0.0]

    def score(start: int, ro: Any) -> tuple[np.ndarray, dict]:
        t = time.perf_counter()
        gids = start + np.asarray(ro.group_ids)
        r, info = runner(
            [prompts[i] for i in gids],
            list(ro.texts),
            [records[i] for i in gids],
            completion_lengths=[int(x) for x in np.asarray(ro.lengths)],
        )
        reward_s[0] += time.perf_counter() - t  # one scoring thread at a time: no race
        return np.asarray(r, np.float32).reshape(len(gids), -1), dict(info or {})

    pool = ThreadPoolExecutor(1, thread_name_prefix="rewards") if overlap_rewards else None
    futures: list[Future] = []
    try:
        ro = _generate_chunked(
            sampler,
            prompts,
            params,
            group_size=group_size,
            key=key,
            chat_template=chat_template,
            prompts_per_call=prompts_per_call,
            first_row=first_row,
            on_chunk=(lambda start, r: futures.append(pool.submit(score, start, r)))
            if pool is not None
            else None,
        )
        t1 = time.perf_counter()
        failure: Exception | None = None
        try:
            if pool is not None:
                parts = [f.result() for f in futures]
            else:
                rows = types.SimpleNamespace(
                    group_ids=ro["group_ids"], texts=ro["texts"], lengths=ro["lengths"]
                )
                parts = [score(0, rows)]
            # In the agreement too: a long prompt on one process (a caller that did not
            # filter its records) raised there alone, the others waiting in a gather.
            longest = max(_used_width(np.asarray(m)) for m in ro["prompt_mask"])
            width = prompt_width(longest, max_prompt_len, prompt_buckets)
        except Exception as e:  # noqa: BLE001 - re-raised below, after the processes agree
            failure = e
        _agree_on_scoring(failure)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    t2 = time.perf_counter()
    rewards = np.concatenate([r for r, _ in parts])
    info: dict[str, Any] = {}
    for _, part in parts:  # counts and times add up over chunks
        for k, v in part.items():
            num = isinstance(v, (int, float)) and isinstance(info.get(k, 0.0), (int, float))
            info[k] = info.get(k, 0.0) + v if num else v
    return {
        "prompt_ids": np.concatenate(
            [_pad_left(np.asarray(x).astype(np.int32), width, pad_id) for x in ro["prompt_ids"]]
        ),
        "prompt_mask": np.concatenate(
            [_pad_left(np.asarray(x).astype(np.int32), width, 0) for x in ro["prompt_mask"]]
        ),
        "completion_ids": ro["completion_ids"].astype(np.int32),
        "completion_mask": ro["completion_mask"].astype(np.int32),
        "old_logp": ro["logprobs"].astype(np.float32),
        "rewards": rewards,
        "group_ids": ro["group_ids"].astype(np.int32),
        "texts": list(ro["texts"]),
        "finish": list(ro["finish_reason"]),
        "sample_s": t1 - t0,
        "reward_s": reward_s[0],
        "reward_wait_s": t2 - t1,
        "reward_info": info,
        "sample_calls": ro["num_calls"],
    }
