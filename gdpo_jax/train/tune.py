"""The fastest ``algo.num_microbatches`` for a config on the machine at hand.

The planner (`gdpo_jax.scale`, ``experiments.plan --fewest_microbatches``)
finds the fewest micro-batches that *fit* a target; which count is *fastest*
depends on the kernels and memory of the machine that runs it (on one H200,
SmolLM2-135M's step ran 1.5-1.7x faster with 2 micro-batches than with 8; on a
2-core CPU, smaller micro-batches keep activations near cache size and were
faster). This module times the config's own RL step for each candidate count:

  * the model, mesh, optimizer and step are built as the trainer builds them
    (`Trainer`'s path, minus sampler, task and rewards), one `CompiledStep`
    per count;
  * the batch is synthetic, at the config's widest shapes: every prompt
    ``sampling.max_prompt_len`` tokens (the same prompt for a group's G rows,
    so prompt sharing applies as in a run) and every completion
    ``sampling.max_new_tokens`` tokens (the step's cost depends on shapes, not
    on token values; a real run's shorter prompt buckets are cheaper, and
    ``prompt_len`` times one of them instead);
  * the counts are timed interleaved (one step of each, round after round)
    so that machine noise hits every count alike; a count the config rejects
    is skipped with the validation message, and a count over the device's
    memory is reported as such.

    result = time_microbatches(cfg, (1, 2, 4, 8), steps=3)
    result["fastest"], result["counts"][4]["median_s"]
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np
from tqdm.auto import tqdm

from gdpo_jax import compile_cache
from gdpo_jax.errors import ConfigError
from gdpo_jax.train import build, distributed
from gdpo_jax.train import mesh as mesh_lib
from gdpo_jax.train import state as state_lib
from gdpo_jax.train.config import prompt_buckets, validate_config, validated_copy
from gdpo_jax.train.step import CompiledStep, StepConfig

__all__ = ["format_table", "synthetic_batch", "time_microbatches"]


def synthetic_batch(
    cfg: mlc.ConfigDict,
    prompts: int,
    vocab_size: int,
    seed: int = 0,
    prompt_len: int | None = None,
) -> dict[str, np.ndarray]:
    """A rollout batch of `prompts` x G rows at the config's widest shapes (or
    prompts padded to `prompt_len`, one of the run's prompt buckets).

    Returns prompt_ids / prompt_mask i32[N, P] (the G rows of a group share
    their prompt), completion_ids / completion_mask i32[N, C] (every row at the
    cap), old_logp and ref_logp (read only by a step that uses them) f32[N, C], rewards
    f32[N, K], group_ids i32[N], valid bool[N]; N = prompts * G, P =
    prompt_len or sampling.max_prompt_len, C = sampling.max_new_tokens, K =
    len(rewards.names).
    Token ids are drawn from [6, vocab_size) (the model's): any id it embeds
    costs the same.
    """
    rng = np.random.default_rng(seed)
    g = int(cfg.algo.group_size)
    n, c = prompts * g, int(cfg.sampling.max_new_tokens)
    p = int(prompt_len or cfg.sampling.max_prompt_len)
    vocab = int(vocab_size)
    prompt = rng.integers(6, vocab, (prompts, p), dtype=np.int32)
    batch = {
        "prompt_ids": np.repeat(prompt, g, axis=0),
        "prompt_mask": np.ones((n, p), np.int32),
        "completion_ids": rng.integers(6, vocab, (n, c), dtype=np.int32),
        "completion_mask": np.ones((n, c), np.int32),
        "old_logp": rng.uniform(-3.0, -0.1, (n, c)).astype(np.float32),
        "rewards": rng.uniform(0.0, 1.0, (n, len(cfg.rewards.names))).astype(np.float32),
        "group_ids": np.repeat(np.arange(prompts, dtype=np.int32), g),
        "valid": np.ones((n,), bool),
    }
    batch["ref_logp"] = batch["old_logp"] - rng.uniform(0.0, 0.1, (n, c)).astype(np.float32)
    return batch


def _with_count(cfg: mlc.ConfigDict, count: int) -> mlc.ConfigDict:
    c = copy.deepcopy(cfg)
    with c.unlocked():
        c.algo.num_microbatches = int(count)
    return c


def _out_of_memory(e: Exception) -> bool:
    msg = str(e)
    return "RESOURCE_EXHAUSTED" in msg or "out of memory" in msg.lower()


def time_microbatches(
    cfg: mlc.ConfigDict,
    counts: Sequence[int],
    *,
    steps: int = 3,
    log: Callable[[str], None] | None = None,
    progress: bool = False,
    prompt_len: int | None = None,
) -> dict[str, Any]:
    """Times the config's RL step at each micro-batch count (module docstring);
    `log` gets one line per count once compiled, `progress` shows a tqdm bar
    over the timed steps; `prompt_len`: the prompt width to time, one of the
    run's prompt buckets (default the widest, sampling.max_prompt_len).

    Returns {"counts": {count: {"status": "ok" | "invalid" | "out of memory",
    "reason" (not ok), "share_prompt" (whether the step ran prompt sharing at this
    count), "compile_s" (first call), "times_s", "median_s", "best_s"}},
    "fastest": the ok count with the smallest median (None if none ran),
    "config_count": cfg's own count, "rows": N, "prompt_len", "new_tokens",
    "steps", "backend", "devices"}.
    """
    if steps < 1:
        raise ValueError(f"steps={steps}: time at least 1 step per count.")
    if not counts:
        raise ValueError("counts is empty: give micro-batch counts to time, e.g. (1, 2, 4).")
    # As a run does (compile_cache.py): steps over several CPU devices loaded from the
    # persistent cache can deadlock, and a loaded one's "compile s" timed the load.
    with compile_cache.compiled_fresh_for_run(cfg):
        return _time_microbatches(cfg, counts, steps, log, progress, prompt_len)


def _time_microbatches(cfg, counts, steps, log, progress, prompt_len) -> dict[str, Any]:
    """`time_microbatches` inside the run's compile-cache rule."""
    say = log or (lambda _msg: None)
    cfg = validated_copy(cfg, "/tmp/gdpo_tune")  # the workdir is never written
    buckets = prompt_buckets(cfg)
    if prompt_len is not None and int(prompt_len) not in buckets:
        raise ConfigError(
            f"prompt_len={prompt_len} is not one of this run's prompt buckets {buckets} "
            "(config.sampling.prompt_buckets); pick one of them."
        )
    prompt_len = int(prompt_len or buckets[-1])
    devices = jax.devices()[: cfg.mesh.num_devices or None]
    mesh = mesh_lib.make_mesh(
        tuple(cfg.mesh.shape), axis_types=cfg.mesh.axis_types, devices=devices
    )
    shards = mesh_lib.batch_axis_size(mesh)
    model, _ = build.build_model(cfg, mesh)
    local_prompts = cfg.algo.num_prompts // jax.process_count()
    arrays = synthetic_batch(
        cfg, local_prompts, model.cfg.vocab_size, seed=int(cfg.seed), prompt_len=prompt_len
    )
    batch = distributed.to_global(arrays, mesh)

    # One train state for every count: its shapes do not depend on the count.
    sc0 = StepConfig.from_config(cfg, batch_shards=shards)
    tx, schedule = state_lib.rl_optimizer(cfg, sc0.updates_per_step)
    graphdef, state = state_lib.create_train_state(model, tx, mesh)
    shardings = state_lib.shardings_of(state)
    # The reference weights sit beside the step as in a run (its argument when
    # the step computes the reference log-probs itself).
    ref = jax.tree.map(jnp.copy, state.params) if sc0.needs_ref else None

    results: dict[int, dict[str, Any]] = {}
    steps_by_count: dict[int, CompiledStep] = {}
    for count in dict.fromkeys(int(c) for c in counts):  # unique, in the given order
        cfg_c = _with_count(cfg, count)
        try:
            validate_config(cfg_c)
        except ConfigError as e:
            results[count] = dict(status="invalid", reason=str(e))
            say(f"  num_microbatches={count}: skipped ({e})")
            continue
        sc = StepConfig.from_config(cfg_c, batch_shards=shards)
        step = CompiledStep(
            graphdef=graphdef,
            tx=tx,
            schedule=schedule,
            cfg=sc,
            state_shardings=shardings,
            mesh=mesh,
        )
        t0 = time.perf_counter()
        try:
            new_state, metrics = step(state, batch, ref)
            jax.block_until_ready(metrics)
        except Exception as e:  # noqa: BLE001 - XLA raises its own runtime error types
            if not _out_of_memory(e):
                raise
            results[count] = dict(status="out of memory", reason=str(e).splitlines()[0][:300])
            say(f"  num_microbatches={count}: out of memory")
            if any(x.is_deleted() for x in jax.tree.leaves(state)):  # donated, then failed
                model, _ = build.build_model(cfg, mesh)
                graphdef, state = state_lib.create_train_state(model, tx, mesh)
            continue
        state = new_state
        results[count] = dict(
            status="ok",
            share_prompt=bool(sc.share_prompt),
            compile_s=time.perf_counter() - t0,
            times_s=[],
        )
        steps_by_count[count] = step
        say(f"  num_microbatches={count}: compiled and ran in {results[count]['compile_s']:.1f} s")

    bar = tqdm(
        total=steps * len(steps_by_count),
        desc="timed steps",
        disable=not progress or not steps_by_count,
        leave=False,
    )
    for _ in range(steps):  # interleaved: one step of each count per round
        for count, step in steps_by_count.items():
            t0 = time.perf_counter()
            state, metrics = step(state, batch, ref)
            jax.block_until_ready(metrics)
            results[count]["times_s"].append(time.perf_counter() - t0)
            bar.update(1)
    bar.close()
    for count in steps_by_count:
        r = results[count]
        r.update(median_s=statistics.median(r["times_s"]), best_s=min(r["times_s"]))
    ok = list(steps_by_count)
    return {
        "counts": results,
        "fastest": min(ok, key=lambda c: results[c]["median_s"]) if ok else None,
        "config_count": int(cfg.algo.num_microbatches),
        "rows": int(cfg.algo.num_prompts * cfg.algo.group_size),
        "prompt_len": prompt_len,
        "new_tokens": int(cfg.sampling.max_new_tokens),
        "steps": int(steps),
        "backend": jax.default_backend(),
        "devices": len(devices),
    }


def format_table(result: dict[str, Any]) -> str:
    """A `time_microbatches` result (or its JSON) as a markdown table, fastest marked."""
    rows = [
        "| num_microbatches | status | prompt sharing | compile s | step s (median) | "
        "step s (best) | vs config's |",
        "|---|---|---|---|---|---|---|",
    ]
    counts = {int(k): v for k, v in result["counts"].items()}  # JSON keys are strings
    base = counts.get(result["config_count"], {}).get("median_s")
    for count, r in counts.items():
        if r["status"] != "ok":
            rows.append(f"| {count} | {r['status']}: {r['reason'][:120]} | - | - | - | - | - |")
            continue
        mark = " (fastest)" if count == result["fastest"] else ""
        ratio = f"{base / r['median_s']:.2f}x" if base else "-"
        rows.append(
            f"| {count}{mark} | ok | {'yes' if r['share_prompt'] else 'no'} | "
            f"{r['compile_s']:.1f} | {r['median_s']:.3f} | "
            f"{r['best_s']:.3f} | {ratio} |"
        )
    return "\n".join(rows)
