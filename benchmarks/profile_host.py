r"""Host work between an RL iteration's device programs, on XLA:CPU.

An iteration of bench_rl's trainer (its tiny Llama and batch, with bench_rl's
layout: 4 micro-batches, layers unrolled, prompt sharing) runs up to three
device programs, the sampler's decode, the reference pass (beta > 0) and the
step, with host Python between them: prompts, detokenizing, rewards, the
batch's arrays. This script measures two things.

1. The rollout's host side per iteration: `Trainer._collect` minus the
   sampler's device time (`Rollouts.info["device_seconds"]`: its program and
   the transfer of its outputs), medians over the timed iterations.
2. What small host computations cost right after the step's program ("cold")
   and again straight after ("warm"), each probe after its own step, ROUNDS
   times: an eager `jax.random.fold_in` (the trainer derives each step's key
   so), the dynamic-sampling spread of a [64, 3] reward batch as eager JAX
   (`core.per_reward_group_spread`, what `train.rollout.groups_with_signal`
   ran on every iteration before 2026-12-03) and as that NumPy function now.

    python -m benchmarks.profile_host [--quick] [--beta 0] \
        [--out runs/bench/profile_host.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from benchmarks import common

DEFAULT_OUT = "runs/bench/profile_host.json"
ROUNDS = 8  # steps per probe (--quick: 2)
ITERATIONS = 8  # timed RL iterations (--quick: 2), after WARMUP
WARMUP = 2


def _ms(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def cold_and_warm(
    program: Callable[[], Any], probes: Mapping[str, Callable[[], Any]], rounds: int
) -> dict[str, dict[str, float]]:
    """{probe: {"cold_ms", "warm_ms"}}: medians over `rounds` of the probe timed
    right after `program` (which must block until its device work is done) and
    once more straight after. Each probe gets its own program call per round."""
    out: dict[str, dict[str, list[float]]] = {n: {"cold": [], "warm": []} for n in probes}
    for _ in range(rounds):
        for name, probe in probes.items():
            program()
            out[name]["cold"].append(_ms(probe))
            out[name]["warm"].append(_ms(probe))
    return {
        n: {f"{k}_ms": round(statistics.median(v), 3) for k, v in t.items()} for n, t in out.items()
    }


def rollout_split(trainer: Any, iterations: int, warmup: int = WARMUP) -> dict[str, float]:
    """Runs warmup + iterations RL iterations of `trainer`; medians over the timed
    ones of the iteration, its rollout (`_collect`), the sampler's device time and
    the rollout's host rest (per iteration: collect minus device)."""
    device: list[float] = []
    collect_s: list[float] = []
    generate, collect = trainer.sampler.generate, trainer._collect

    def timed_generate(*a: Any, **k: Any) -> Any:
        ro = generate(*a, **k)
        device.append(float(ro.info["device_seconds"]))
        return ro

    def timed_collect(step: int) -> Any:
        t0 = time.perf_counter()
        out = collect(step)
        collect_s.append(time.perf_counter() - t0)
        return out

    # Instance attributes shadow the methods for this run only.
    trainer.sampler.generate, trainer._collect = timed_generate, timed_collect
    try:
        iters = [trainer.train_step(i)["time/iter_s"] for i in range(warmup + iterations)]
    finally:
        del trainer.sampler.generate, trainer._collect
    if len(device) != len(collect_s):
        raise RuntimeError("expected one sampler call per rollout (no dynamic sampling)")
    host = [c - d for c, d in zip(collect_s[warmup:], device[warmup:])]
    return {
        "iter_s": round(statistics.median(iters[warmup:]), 4),
        "collect_s": round(statistics.median(collect_s[warmup:]), 4),
        "sampler_device_s": round(statistics.median(device[warmup:]), 4),
        "rollout_host_ms": round(statistics.median(host) * 1e3, 2),
    }


def run(quick: bool = False, beta: float = 0.0) -> dict[str, Any]:
    import jax
    from flax import nnx

    from benchmarks import bench_rl
    from benchmarks.profile_step import _trainer
    from gdpo_jax.core.advantages import per_reward_group_spread
    from gdpo_jax.train.rollout import groups_with_signal

    shape = bench_rl.SHAPES["tiny"]
    trainer, batch = _trainer(
        shape.microbatches, beta, scan_layers=shape.scan_layers, share_prompt=True
    )
    rows, group = shape.prompts * shape.generations, shape.generations
    rewards = np.random.default_rng(0).integers(0, 3, (rows, 3)).astype(np.float32)
    ids = np.repeat(np.arange(shape.prompts, dtype=np.int32), group)
    key = jax.random.key(0)

    def step() -> None:
        trainer.state, m = trainer.step(trainer.state, batch, trainer.ref_params)
        jax.block_until_ready((trainer.state, m))
        nnx.update(trainer.model, trainer.state.params)  # the old params were donated

    probes = {
        "eager `jax.random.fold_in`": lambda: jax.block_until_ready(jax.random.fold_in(key, 1)),
        "reward spread, eager JAX (`core.per_reward_group_spread`)": lambda: np.asarray(
            per_reward_group_spread(rewards, ids, num_groups=shape.prompts)
        ),
        "reward spread, NumPy (`train.rollout.groups_with_signal`)": lambda: groups_with_signal(
            rewards, group_size=group, decoupled=True
        ),
    }
    for probe in probes.values():  # compiled and cached before any timing
        probe()
    rounds, iterations = (2, 2) if quick else (ROUNDS, ITERATIONS)
    probe_ms = cold_and_warm(step, probes, rounds)
    split = rollout_split(trainer, iterations)
    trainer.runner.close()
    return {
        "benchmark": "profile_host",
        "quick": quick,
        "beta": beta,
        "rounds": rounds,
        "iterations": iterations,
        "probes": probe_ms,
        "rollout": split,
    }


def table_markdown(res: Mapping[str, Any]) -> str:
    """The markdown table and its caption (docs/benchmarks.md shows the committed run's)."""
    rows = [
        {
            "host work": name,
            "right after the step, ms": f"{t['cold_ms']:.2f}",
            "again, ms": f"{t['warm_ms']:.2f}",
        }
        for name, t in res["probes"].items()
    ]
    m, r = res.get("machine", {}), res["rollout"]
    return (
        common.markdown_table(rows)
        + f"\n\n{common.cpu_label(m)}; bench_rl's trainer, beta {res['beta']:g}; medians of "
        f"{res['rounds']} rounds, "
        "each probe after its own step. Per RL iteration (medians of "
        f"{res['iterations']}): {r['iter_s']:.3f} s, of which the rollout {r['collect_s']:.3f} s: "
        f"the sampler's device program {r['sampler_device_s']:.3f} s and host work "
        f"{r['rollout_host_ms']:.1f} ms."
    )


def main() -> None:
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers, as run_all's children
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    common.check_out(ap, args.out, "--out", is_dir=False)  # before the run
    res = run(args.quick, args.beta) | {"machine": common.machine_info()}
    common.write_json(args.out, res)
    print(table_markdown(res))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
