"""One process of the multi-host test: a train step on its share of a global batch.

    python -m tests._multihost_worker <process_id> <num_processes> <port> <out.json>

Each process has 2 CPU devices (4 in all). Writes loss, metrics and per-leaf
parameter sums after the update. `run_step(jax.devices()[:4])` in one process
is the single-process reference.
"""
from __future__ import annotations

import json
import os
import sys


def main() -> None:
    pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={4 // nproc}"
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from gdpo_jax.train import distributed
    if nproc > 1:
        assert distributed.initialize("always", coordinator_address=f"127.0.0.1:{port}",
                                      num_processes=nproc, process_id=pid)
    assert jax.device_count() == 4 and jax.process_count() == nproc
    result = run_step(jax.devices())
    with open(out, "w") as f:
        json.dump(result, f)
    if nproc > 1:
        jax.distributed.shutdown()


def run_step(devices) -> dict:
    """One step on a (2, 2, 1) mesh over `devices`; this process feeds only its rows."""
    import jax
    import jax.numpy as jnp
    from gdpo_jax.models.sharding import create_model
    from gdpo_jax.train import distributed, mesh as mesh_lib, state as state_lib
    from gdpo_jax.train.config import base_config
    from gdpo_jax.train.step import CompiledStep, StepConfig
    from tests.test_train_step import CFG, NUM_GROUPS, make_batch

    mesh = mesh_lib.make_mesh((2, 2, 1), devices=devices)
    optim = base_config().optim
    optim.lr = 1e-2
    tx, schedule = state_lib.make_optimizer(optim, total_updates=2)
    model = create_model(CFG, mesh=mesh, seed=0)
    graphdef, state = state_lib.create_train_state(model, tx, mesh)
    sc = StepConfig(num_groups=NUM_GROUPS, weights=(1.0, 0.5), num_microbatches=2, beta=0.02)
    step = CompiledStep(graphdef=graphdef, tx=tx, schedule=schedule, cfg=sc,
                        state_shardings=state_lib.shardings_of(state), mesh=mesh)
    full = make_batch(5, with_ref=True)
    lo, hi = distributed.host_rows(full["rewards"].shape[0])
    local = {k: v[lo:hi] for k, v in full.items()}      # this host's rows only
    state, metrics = step(state, distributed.to_global(local, mesh))
    sums = jax.jit(lambda p: jax.tree.map(lambda x: jnp.sum(x.astype(jnp.float32) ** 2), p),
                   out_shardings=mesh_lib.replicated(mesh))
    with jax.set_mesh(mesh):
        leaf_sums = sums(state.params)

    def host(x):
        return float(x.addressable_data(0)) if hasattr(x, "addressable_data") else float(x)

    return {"metrics": {k: host(v) for k, v in metrics.items()},
            "param_sums": [host(x) for x in jax.tree.leaves(leaf_sums)], "rows": [lo, hi]}


if __name__ == "__main__":
    main()
