"""One rollout batch on the host: prompts -> Sampler -> RewardRunner -> arrays.

With dynamic sampling, groups whose rewards have no spread are dropped and
more prompts are sampled until the batch is full or the tries run out (with
several processes: until every process's batch is full, all in lock step,
since sampling is a collective); under
GDPO a group is kept when *any* reward has spread (its summed reward may be
constant and still carry signal in one reward), under GRPO when the weighted
sum has spread. The row count never changes: a batch still short after the
last try is filled with dropped groups marked invalid (valid=False: no loss, no
statistics), so dynamic sampling adds no compilations (the step compiles once
per prompt width, `sampling.prompt_buckets`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from gdpo_jax import multihost
from gdpo_jax.data.stream import PromptStream
from gdpo_jax.train import distributed
from gdpo_jax.train.sample_score import _pad_left, prompt_width, sample_and_score

__all__ = [
    "collect_batch",
    "group_has_signal",
    "groups_with_signal",
    "prompt_width",
    "rollout_metrics",
    "row_stats",
    "sample_and_score",
]


def groups_with_signal(
    rewards: np.ndarray,
    *,
    group_size: int,
    decoupled: bool,
    weights: Sequence[float] | None = None,
    nan_rewards: str = "omit",
) -> np.ndarray:
    """rewards f32[P * G, K] of P contiguous groups of G rows -> bool[P]: whether
    the group has a learning signal, per reward under GDPO (the spec's filter).

    decoupled (GDPO): some reward column of nonzero weight has >= 2 distinct
    scorable (finite) float32 values, the definition of
    `core.per_reward_group_spread`, its JAX form (tests/test_train_rollout.py
    checks the two agree); a column of weight 0 adds nothing to the advantage.
    With nan_rewards="zero" (`core.compute_advantages`) a non-finite reward counts
    as a 0 there. Such a group can still sum to a zero advantage: two rewards that
    trade off with equal weights (rows [1, 0] and [0, 1]) cancel after per-reward
    normalization; it is kept, as the spec's per-reward filter keeps it.
    Otherwise (GRPO): the weighted sum as `core.compute_advantages` forms it
    (non-finite rewards as 0, in float32) has >= 2 distinct values.

    NumPy only: this runs on the host between the sampler's and the step's
    device programs, where even a few eager JAX operations cost milliseconds
    (the first host work after a large program runs far slower than warm).
    """
    rewards = np.asarray(rewards)
    if rewards.ndim != 2 or group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"rewards of shape {rewards.shape} must be [P * group_size, K] with "
            f"group_size={group_size} >= 1 dividing the rows."
        )
    num_groups = rewards.shape[0] // group_size
    if decoupled:
        r = np.asarray(rewards, np.float32).reshape(num_groups, group_size, rewards.shape[1])
        if nan_rewards == "zero":
            r = np.where(np.isfinite(r), r, np.float32(0))
        scorable = np.isfinite(r)
        hi = np.where(scorable, r, -np.inf).max(axis=1, initial=-np.inf)
        lo = np.where(scorable, r, np.inf).min(axis=1, initial=np.inf)
        spread = hi > lo
        if weights is not None:
            spread = spread[:, np.asarray(weights, np.float64) != 0]
        return spread.any(axis=1)
    k = rewards.shape[1]
    w = np.ones(k, np.float32) if weights is None else np.asarray(weights, np.float32)
    r = np.asarray(rewards, np.float32)
    s = (np.where(np.isfinite(r), r, np.float32(0)) * w).sum(axis=1, dtype=np.float32)
    return np.ptp(s.reshape(num_groups, group_size), axis=1) > 0


def group_has_signal(
    rewards: np.ndarray,
    *,
    decoupled: bool,
    weights: Sequence[float] | None = None,
    nan_rewards: str = "omit",
) -> bool:
    """rewards f32[G, K] of one group -> whether normalizing it gives any nonzero
    advantage (see `groups_with_signal`)."""
    rewards = np.asarray(rewards)
    return bool(
        groups_with_signal(
            rewards,
            group_size=rewards.shape[0],
            decoupled=decoupled,
            weights=weights,
            nan_rewards=nan_rewards,
        )[0]
    )


_ARRAYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "old_logp", "rewards")


def collect_batch(
    stream: PromptStream,
    *,
    num_prompts: int,
    group_size: int,
    key: jax.Array,
    dynamic: bool = False,
    max_tries: int = 1,
    decoupled: bool = True,
    weights: Sequence[float] | None = None,
    nan_rewards: str = "omit",
    group_offset: int = 0,
    **kw: Any,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A full host batch of `num_prompts` groups (rows num_prompts * G).

    Args:
      stream: prompt records for this host.
      key: PRNG key of this step (try t uses fold_in(key, t)).
      dynamic / max_tries: dynamic sampling (see module docstring).
      decoupled: judge spread per reward (GDPO) or on the weighted sum (GRPO).
      nan_rewards: unscorable rewards as the step takes them ("omit" / "zero").
      group_offset: added to group ids (this host's first global group).
      **kw: passed to `sample_and_score` (sampler, runner, params, ...).
    Returns:
      (arrays incl. group_ids and valid, info with texts, timings, counts).
    """
    kept: list[tuple[dict, int]] = []  # (scored try, group index) with signal
    dropped: list[tuple[dict, int]] = []
    tries, sample_s, reward_s, reward_wait_s, sample_calls = 0, 0.0, 0.0, 0.0, 0
    reward_info: dict[str, float] = {}
    scored_groups = 0
    while True:
        records = stream.take(num_prompts)
        out = sample_and_score(
            records,
            group_size=group_size,
            key=jax.random.fold_in(key, tries),
            first_row=group_offset * group_size,  # rows numbered as in one process
            **kw,
        )
        tries += 1
        sample_s += out["sample_s"]
        reward_s += out["reward_s"]
        reward_wait_s += out["reward_wait_s"]
        sample_calls += out["sample_calls"]
        for k, v in out["reward_info"].items():  # runner's per-reward times / failures
            if isinstance(v, (int, float)):
                reward_info[k] = reward_info.get(k, 0.0) + float(v)
        signal = (
            groups_with_signal(
                out["rewards"][: num_prompts * group_size],
                group_size=group_size,
                decoupled=decoupled,
                weights=weights,
                nan_rewards=nan_rewards,
            )
            if dynamic
            else np.ones(num_prompts, bool)  # every group is kept
        )
        for g in range(num_prompts):
            (kept if signal[g] else dropped).append((out, g))
        scored_groups += num_prompts
        if not dynamic or tries >= max_tries:
            break
        # Sampling is a collective over all processes: every process tries
        # again while any one of them is short (a full one's extras are unused).
        if not distributed.any_process(len(kept) < num_prompts):
            break
    chosen = kept[:num_prompts]
    valid_groups = len(chosen)
    chosen += dropped[: num_prompts - len(chosen)]

    # One prompt width for the batch: the widest chosen try's, the same on every
    # process (the step's global arrays need one shape).
    width = max(out["prompt_ids"].shape[1] for out, _ in chosen)
    if jax.process_count() > 1:
        width = int(multihost.allgather(np.asarray(width, np.int64)).max())
    pads = {"prompt_ids": kw.get("pad_id", 0), "prompt_mask": 0}
    batch: dict[str, Any] = {k: [] for k in _ARRAYS}
    texts, finish = [], []
    for out, g in chosen:
        rows = slice(g * group_size, (g + 1) * group_size)
        for k in _ARRAYS:
            x = out[k][rows]
            batch[k].append(_pad_left(x, width, pads[k]) if k in pads else x)
        texts += out["texts"][rows]
        finish += out["finish"][rows]
    arrays = {k: np.concatenate(v, axis=0) for k, v in batch.items()}
    n = num_prompts * group_size
    arrays["group_ids"] = (np.repeat(np.arange(num_prompts), group_size) + group_offset).astype(
        np.int32
    )
    arrays["valid"] = np.repeat(np.arange(num_prompts) < valid_groups, group_size)
    assert arrays["rewards"].shape[0] == n
    info = {
        "texts": texts,
        "finish": finish,
        "sample_s": sample_s,
        "reward_s": reward_s,
        "reward_wait_s": reward_wait_s,
        "tries": tries,
        "kept_groups": len(kept),
        "scored_groups": scored_groups,
        "valid_groups": valid_groups,
        "reward_info": reward_info,
        "sample_calls": sample_calls,
    }
    return arrays, info


def row_stats(arrays: dict[str, np.ndarray], finish: Sequence[str]) -> dict[str, np.ndarray]:
    """Per-row facts the metrics need, [N] each: rewards f32[N, K], valid bool[N],
    completion_len / prompt_len i32[N], truncated bool[N].

    What processes exchange for metrics: O(N) values, not the [N, C] / [N, P]
    masks (at paper shapes 8192 x 8000 int32 masks are 262 MB a step).
    """
    return {
        "rewards": np.asarray(arrays["rewards"], np.float32),
        "valid": np.asarray(arrays["valid"], bool),
        "completion_len": np.asarray(arrays["completion_mask"]).sum(1).astype(np.int32),
        "prompt_len": np.asarray(arrays["prompt_mask"]).sum(1).astype(np.int32),
        "truncated": np.asarray([f == "length" for f in finish], bool).reshape(-1),
    }


def rollout_metrics(
    arrays: dict[str, np.ndarray],
    finish: Sequence[str],
    reward_names: Sequence[str],
    weights: Sequence[float] | None,
) -> dict[str, float]:
    """Reward mean/std per reward (non-finite excluded, as the advantages exclude them;
    nan_frac counts them), weighted total (non-finite as 0), lengths, truncation.

    arrays: rewards, valid and either completion_len i32[N] (see `row_stats`)
    or completion_mask i32[N, C].
    """
    valid = arrays["valid"].astype(bool)
    r = arrays["rewards"][valid].astype(np.float64)
    out: dict[str, float] = {}
    nan = float("nan")
    w = np.ones(len(reward_names)) if not weights else np.asarray(weights, np.float64)
    for k, name in enumerate(reward_names):
        col = r[:, k]
        ok = np.isfinite(col)
        out[f"reward/{name}/mean"] = float(col[ok].mean()) if ok.any() else float("nan")
        out[f"reward/{name}/std"] = float(col[ok].std()) if ok.any() else float("nan")
        out[f"reward/{name}/nan_frac"] = float(1 - ok.mean()) if col.size else nan
    # No valid row (dynamic sampling found no group with signal): NaN, as the per-reward
    # means. 0.0 was finite, so the plots averaged a reward of 0 (a NaN share of 0) in.
    finite = np.where(np.isfinite(r[:, : len(w)]), r[:, : len(w)], 0.0)
    out["reward/total"] = float((finite @ w).mean()) if r.size else nan
    if "completion_len" in arrays:
        lengths = np.asarray(arrays["completion_len"])[valid]
    else:
        lengths = arrays["completion_mask"].sum(1)[valid]
    out["len/mean"] = float(lengths.mean()) if lengths.size else nan
    out["len/max"] = float(lengths.max()) if lengths.size else nan
    fin = np.asarray(finish)[valid] if len(finish) else np.asarray([])
    out["len/truncated_frac"] = float((fin == "length").mean()) if fin.size else nan
    return out


def host_metrics(
    info: dict[str, Any],
    reduce: Callable[[dict[str, float]], dict[str, float]] | None = None,
) -> dict[str, float]:
    """A step's host-side metrics from `collect_batch`'s info: reward failures,
    timeouts and times, and the sampling / reward times.

    `reduce` combines them over processes (`distributed.reduce_processes`: counts
    summed, times the slowest host's). `time/reward_overlap_s` is computed after it,
    so `reward_s = reward_wait_s + reward_overlap_s` holds for the logged values with
    several processes too (it was process 0's own overlap beside the slowest host's
    reward_s and wait).
    """
    host = {
        k: float(v)
        for k, v in info["reward_info"].items()
        if k.startswith(("reward_failures/", "reward_time/", "reward_timeouts/"))
    }
    host["time/sample_s"] = float(info["sample_s"])
    host["time/reward_s"] = float(info["reward_s"])
    # Reward time not hidden behind the next chunk's decode (overlap).
    host["time/reward_wait_s"] = float(info["reward_wait_s"])
    if reduce is not None:
        host = reduce(host)
    host["time/reward_overlap_s"] = max(host["time/reward_s"] - host["time/reward_wait_s"], 0.0)
    return host


def score_shared(
    part: Sequence[dict], group_size: int, *, first_record: int = 0, **kw: Any
) -> dict[str, Any]:
    """`sample_and_score` of the held-out records `part`, split over the processes.

    Each process samples a contiguous share (the last one padded with repeats of the
    last record: the sampler is one collective, every process brings the same count);
    the results are gathered, so every process returns all len(part) * group_size rows
    in record order: {"texts": list, "rewards": f32[R, K], "lengths": i64[R]}.
    first_record: the index of part[0] among all the records scored with `kw["key"]`:
      a row's random stream is its place there (record * group_size + sample), so a
      sampled eval is the same however its records are chunked (`rows_per_call`, which
      a resume may change) or split over processes.
    kw: sample_and_score's other arguments.
    """
    pi, pc = jax.process_index(), jax.process_count()
    per = -(-len(part) // pc)
    mine = list(part[pi * per : (pi + 1) * per])
    mine += [part[-1]] * (per - len(mine))
    first_row = (first_record + pi * per) * group_size
    out = sample_and_score(mine, group_size=group_size, first_row=first_row, **kw)
    rows = len(part) * group_size  # real rows come first, process by process
    texts = [t for host in distributed.allgather_strings(out["texts"]) for t in host][:rows]
    k = out["rewards"].shape[1]
    rewards = distributed.allgather_host(out["rewards"]).reshape(-1, k)[:rows]
    lengths = distributed.allgather_host(out["completion_mask"].sum(1)).reshape(-1)[:rows]
    return {"texts": texts, "rewards": rewards, "lengths": lengths}
