r"""Does the fused RL step over several CPU devices, freshly compiled, run many times?

XLA:CPU's concurrency-optimized scheduler (jaxlib 0.10.2) can order one program's
collectives differently on different devices, and the program then deadlocks
(gdpo_jax/xla_cpu.py). This probe runs the fused RL step of tests/test_train_step.py
(old and reference log-probs in the step, 2 micro-batches, a (2, 2, 1) mesh)
`--iters` times in a row, compiled once, no persistent cache, in two layouts:

- "1 process x 4 devices": `--xla_force_host_platform_device_count=4`;
- "2 processes x 2 devices": two processes joined by `jax.distributed` (gloo).

For each XLA_FLAGS setting it makes `--runs` such runs and records each run's
executions done and how it ended: "finished", "aborted" (a non-zero exit: XLA's abort
after its 40 s rendezvous wait, or gloo's "collective mismatch"), or "hung" (killed
at `--timeout`).

    python -m benchmarks.probe_cpu_collectives_repeat [--runs 3] [--iters 400] \
        [--timeout 150] [--out runs/bench/cpu_collectives_repeat.json]

About 10 minutes at the defaults on a 2-core machine; needs it otherwise idle.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from typing import Any

from benchmarks import common
from gdpo_jax.xla_cpu import ORDERED_SCHEDULER, SCHEDULER_FLAG

DEFAULT_OUT = "runs/bench/cpu_collectives_repeat.json"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {
    # Named explicitly: `import gdpo_jax` adds the ordered one to flags naming neither.
    "default scheduler": f"--{SCHEDULER_FLAG}=true",
    "ordered scheduler": ORDERED_SCHEDULER,
}
LAYOUTS = {"1 process x 4 devices": (1, 4), "2 processes x 2 devices": (2, 2)}


def worker(process_id: int, num_processes: int, port: int, iters: int) -> None:
    """Runs the step `iters` times; prints each execution's index (the parent counts)."""
    import jax

    from gdpo_jax.train import distributed

    if num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        distributed.initialize(
            "always",
            coordinator_address=f"127.0.0.1:{port}",
            num_processes=num_processes,
            process_id=process_id,
        )
    from flax import nnx

    from gdpo_jax.models.sharding import create_model
    from gdpo_jax.train import mesh as mesh_lib
    from gdpo_jax.train import state as state_lib
    from gdpo_jax.train.config import base_config
    from gdpo_jax.train.step import CompiledStep, StepConfig
    from tests.test_train_step import CFG, NUM_GROUPS, make_batch

    mesh = mesh_lib.make_mesh((2, 2, 1), devices=jax.devices())
    tx, schedule = state_lib.make_optimizer(base_config().optim, total_updates=10**6)
    graphdef, state = state_lib.create_train_state(create_model(CFG, mesh=mesh, seed=0), tx, mesh)
    sc = StepConfig(
        num_groups=NUM_GROUPS,
        weights=(1.0, 0.5),
        num_microbatches=2,
        beta=0.02,
        old_logp_in_step=True,
        ref_logp_in_step=True,
    )
    step = CompiledStep(
        graphdef=graphdef,
        tx=tx,
        schedule=schedule,
        cfg=sc,
        state_shardings=state_lib.shardings_of(state),
        mesh=mesh,
    )
    ref = nnx.state(create_model(CFG, mesh=mesh, seed=3), nnx.Param)
    full = make_batch(5, with_ref=True)
    lo, hi = distributed.host_rows(full["rewards"].shape[0])
    batch = distributed.to_global({k: v[lo:hi] for k, v in full.items()}, mesh)
    for i in range(iters):
        state, metrics = step(state, batch, ref)
        jax.block_until_ready(metrics)
        print(f"step {i + 1}", flush=True)
    if num_processes > 1:
        jax.distributed.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(layout: str, xla_flags: str, iters: int, timeout_s: float) -> dict[str, Any]:
    """One run of the layout's processes; their executions done and how it ended."""
    nproc, ndev = LAYOUTS[layout]
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(
        JAX_PLATFORMS="cpu",
        PYTHONPATH=ROOT,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={ndev} {xla_flags}".strip(),
    )
    port = _free_port()
    cmd = [sys.executable, "-m", "benchmarks.probe_cpu_collectives_repeat", "--worker"]
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [*cmd, str(i), str(nproc), str(port), str(iters)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for i in range(nproc)
    ]
    hung = False
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(timeout_s - (time.perf_counter() - t0), 1.0))
        except subprocess.TimeoutExpired:
            hung = True
            p.kill()
            out, _ = p.communicate()
        outs.append(out)
    done = min(out.count("step ") for out in outs)
    if hung:
        end = "hung"
    elif any(p.returncode != 0 for p in procs):
        end = "aborted"
    else:
        end = "finished"
    return {"executions": done, "end": end, "seconds": round(time.perf_counter() - t0, 1)}


def run(
    runs: int = 3, iters: int = 400, timeout_s: float = 150.0, layouts: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Returns a JSON-able dict: one row per (setting, layout)."""
    rows = []
    for label, flags in SETTINGS.items():
        for layout in layouts or tuple(LAYOUTS):
            got = [one_run(layout, flags, iters, timeout_s) for _ in range(runs)]
            rows.append(
                {
                    "setting": label,
                    "xla_flags": flags,
                    "layout": layout,
                    "iters": iters,
                    "runs": runs,
                    "finished": sum(r["end"] == "finished" for r in got),
                    "executions": [r["executions"] for r in got],
                    "ends": [r["end"] for r in got],
                    "seconds": [r["seconds"] for r in got],
                }
            )
            print(common.text_table(rows[-1:]), flush=True)
    return {
        "benchmark": "cpu_collectives_repeat",
        "machine": common.machine_info(),
        "command": common.command_line(),
        "measured_at": common.now_iso(),
        "results": rows,
    }


def format_table(results: list[dict[str, Any]]) -> str:
    """Markdown table of the result rows."""
    lines = [
        "| XLA_FLAGS beside the device count | layout | runs | finished | executions done "
        "(of each run's target) | how the others ended |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| `{r['xla_flags']}` | {r['layout']} | {r['runs']} | {r['finished']} | "
            f"{', '.join(map(str, r['executions']))} (of {r['iters']}) | "
            f"{common.other_ends(r['ends'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*(int(a) for a in sys.argv[2:6]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="Runs per setting and layout.")
    parser.add_argument("--iters", type=int, default=400, help="Step executions per run.")
    parser.add_argument("--timeout", type=float, default=150.0, help="Seconds per run.")
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON output path.")
    args = parser.parse_args()
    common.check_out(parser, args.out, "--out", is_dir=False)  # before the run
    result = run(args.runs, args.iters, args.timeout, tuple(args.layouts))
    print(format_table(result["results"]))
    print(f"wrote {common.write_json(args.out, result)}")


if __name__ == "__main__":
    main()
