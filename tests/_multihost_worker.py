"""One process of the multi-host test: a train step on its share of a global
batch, sampling with its own prompts, and the RL loop.

    python -m tests._multihost_worker <process_id> <num_processes> <port> <out.json> <workdir>

Each process has 2 CPU devices (4 in all). Writes the host collectives' results
(`run_collectives`), loss, metrics and per-leaf parameter sums after the update,
this process's sampled rows, and the RL loop's per-step metrics.
`run_collectives(...)`, `run_step(jax.devices()[:4])`, `run_sampler(...)` and
`run_loop(...)` in one process are the single-process references.
"""

from __future__ import annotations

import json
import os
import sys

from tests._quick_compile import quick_compile_flags


def main() -> None:
    pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    workdir = sys.argv[5]
    os.environ["JAX_PLATFORMS"] = "cpu"
    # The suite's quick-compile flags (tests/_quick_compile.py), as the test's own process
    # has them: the workers compile every program themselves, with no cache.
    os.environ["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={4 // nproc} {quick_compile_flags()}"
    )
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from gdpo_jax.train import distributed

    if nproc > 1:
        assert distributed.initialize(
            "always", coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid
        )
    assert jax.device_count() == 4 and jax.process_count() == nproc
    result = {"collectives": run_collectives(workdir + "_collectives")}
    result.update(run_step(jax.devices()))
    result["sampler"] = run_sampler(
        jax.devices(), SAMPLER_PROMPTS[pid::nproc][0] if nproc > 1 else sum(SAMPLER_PROMPTS, [])
    )
    # The trainer's chunked calls (sampling.rows_per_call): 4 prompts per process in
    # calls of 2, each process numbering its rows from its place in the whole batch.
    mine = CHUNKED_PROMPTS[4 * pid : 4 * pid + 4] if nproc > 1 else CHUNKED_PROMPTS
    result["sampler_chunked"] = run_sampler(
        jax.devices(), mine, prompts_per_call=2, first_row=4 * pid * 2 if nproc > 1 else 0
    )
    # Saved and resumed: with several processes the first save raised (the key was a
    # host-local array item, which orbax refuses to write).
    result["resume"] = {}
    result["loop"] = run_loop(workdir, num_devices=4, resume=result["resume"])
    # Chunked generation: 16 rows in calls of 8 (1 prompt x G 4 per process per call).
    # Also a reward that fails on process 1 only (scored NaN): both report its failures.
    result["loop_chunked"] = run_loop(
        workdir + "_chunked", num_devices=4, rows_per_call=8, extra_reward="test_fails_on_p1"
    )
    with open(out, "w") as f:
        json.dump(result, f)
    if nproc > 1:
        jax.distributed.shutdown()


def run_step(devices) -> dict:
    """One step on a (2, 2, 1) mesh over `devices`; this process feeds only its rows."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from gdpo_jax.models.sharding import create_model
    from gdpo_jax.train import distributed
    from gdpo_jax.train import mesh as mesh_lib
    from gdpo_jax.train import state as state_lib
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

    def compiled(cfg: StepConfig) -> CompiledStep:
        shardings = state_lib.shardings_of(state)
        return CompiledStep(
            graphdef=graphdef,
            tx=tx,
            schedule=schedule,
            cfg=cfg,
            state_shardings=shardings,
            mesh=mesh,
        )

    step = compiled(sc)
    full = make_batch(5, with_ref=True)
    lo, hi = distributed.host_rows(full["rewards"].shape[0])
    local = {k: v[lo:hi] for k, v in full.items()}  # this host's rows only
    state, metrics = step(state, distributed.to_global(local, mesh))
    sums = jax.jit(
        lambda p: jax.tree.map(lambda x: jnp.sum(x.astype(jnp.float32) ** 2), p),
        out_shardings=mesh_lib.replicated(mesh),
    )
    with jax.set_mesh(mesh):
        leaf_sums = sums(state.params)

    def host(x):
        return float(x.addressable_data(0)) if hasattr(x, "addressable_data") else float(x)

    # The same update with the old and the reference log-probs from the step's own
    # micro-batch loop (StepConfig.old_logp_in_step / ref_logp_in_step): the reference
    # params (another model, placed like the policy's) are the step's argument.
    fused_sc = dataclasses.replace(sc, old_logp_in_step=True, ref_logp_in_step=True)
    graphdef, state = state_lib.create_train_state(create_model(CFG, mesh=mesh, seed=0), tx, mesh)
    ref = nnx.state(create_model(CFG, mesh=mesh, seed=3), nnx.Param)
    fused = compiled(fused_sc)
    state, fused_metrics = fused(state, distributed.to_global(local, mesh), ref)
    with jax.set_mesh(mesh):
        fused_sums = sums(state.params)
    return {
        "metrics": {k: host(v) for k, v in metrics.items()},
        "param_sums": [host(x) for x in jax.tree.leaves(leaf_sums)],
        "fused_metrics": {k: host(v) for k, v in fused_metrics.items()},
        "fused_param_sums": [host(x) for x in jax.tree.leaves(fused_sums)],
        "rows": [lo, hi],
    }


# Host collectives: what each process passes (allgather cases are the same on every
# process); the results must equal one process's, exact, in the same dtype.
ALLGATHER_CASES = {
    "int64": ([2**31 + 5, -3], "int64"),
    "float64": ([[0.1, 16777217.0]], "float64"),
    "bfloat16": ([1.5, -2.0], "bfloat16"),
    "bool": ([True, False], "bool"),
    "scalar_f64": (0.1, "float64"),
}
# Lone surrogates (from decoded completions) on both processes: the strict encode
# raised on both (on one only it left the other waiting in the collective, a hang).
STRINGS = [["ok", "bad\udc80"], ["x\ud83d", "\u00e9"]]


def run_collectives(workdir: str) -> dict:
    """gdpo_jax.multihost / train.distributed host collectives and save_pretrained's
    barrier; a raised error is recorded, not raised (the test shows which case)."""
    import time

    import jax
    import ml_dtypes
    import numpy as np

    from gdpo_jax import multihost
    from gdpo_jax.train import distributed, loop

    pid, n = jax.process_index(), jax.process_count()
    out: dict = {}

    def record(name, fn, *args):
        try:
            out[name] = fn(*args)
        except Exception as e:  # the other process records the same case
            out[name] = f"RAISED {type(e).__name__}: {e}"

    def gathered(values, dtype):
        dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
        g = multihost.allgather(np.asarray(values, dt))
        exact = g.tolist() if g.dtype.kind in "bi" else g.astype(np.float64).tolist()
        return [str(g.dtype), list(g.shape), exact]

    for name, (values, dtype) in ALLGATHER_CASES.items():
        record(f"allgather/{name}", gathered, values, dtype)
    record(
        "sum_processes",
        lambda: [distributed.sum_processes(16777217.0), distributed.sum_processes(0.1)],
    )
    record(
        "reduce_processes",
        lambda: distributed.reduce_processes(
            {"reward_failures/x": 16777217.0, "time/a": 1 + 1e-9}, max_prefixes=("time/",)
        ),
    )
    rows = {"ids": np.asarray([2**40 + pid, 1], np.int64), "f": np.asarray([0.1 * (pid + 1)])}
    record(
        "gather_rows",
        lambda: {k: [str(v.dtype), v.tolist()] for k, v in loop._gather_rows(rows).items()},
    )
    record("allgather_strings", lambda: distributed.allgather_strings(sum(STRINGS[pid::n], [])))

    # save_pretrained: process 0 writes slowly; every process must return only after
    # it has written (the other returned at once, before config.json existed).
    from gdpo_jax.models import export
    from gdpo_jax.models.sharding import create_model
    from gdpo_jax.train import mesh as mesh_lib
    from tests.test_train_step import CFG

    model = create_model(CFG, mesh=mesh_lib.make_mesh((2, 2, 1), devices=jax.devices()[:4]))
    write = export.write_safetensors

    def slow_write(*a, **kw):
        time.sleep(1.0)
        return write(*a, **kw)

    if pid == 0 and n > 1:
        export.write_safetensors = slow_write
    try:
        record(
            "export",
            lambda: (
                export.save_pretrained(model, None, workdir) == workdir
                and [
                    os.path.exists(os.path.join(workdir, f))
                    for f in ("model.safetensors", "config.json")
                ]
            ),
        )
    finally:
        export.write_safetensors = write
    return out


# Process 0 / process 1 prompts (unequal counts); one process samples all five.
SAMPLER_PROMPTS = [[[7, 8, 9], [10], [11, 12]], [[13, 14, 15, 16], [17, 18]]]
CHUNKED_PROMPTS = [[7 + i, 20 - i] if i % 2 else [9 + i] for i in range(8)]


def run_sampler(devices, prompts, prompts_per_call: int = 0, first_row: int = 0) -> dict:
    """Temperature-1 sampling on a (2, 2, 1) mesh; this process passes only `prompts`.
    prompts_per_call > 0: through the trainer's chunked calls (`sample_and_score`),
    this process's rows numbered from `first_row`."""
    import jax
    import numpy as np

    from gdpo_jax.models.sharding import create_model
    from gdpo_jax.sampling import Sampler, SamplingParams
    from gdpo_jax.train import mesh as mesh_lib
    from tests.test_train_step import CFG

    mesh = mesh_lib.make_mesh((2, 2, 1), devices=devices)
    model = create_model(CFG, mesh=mesh, seed=1)
    sampler = Sampler(model, None, mesh=mesh, prompt_buckets=(8,))
    params = SamplingParams(max_new_tokens=5, temperature=1.0)
    if prompts_per_call:
        from gdpo_jax.train.rollout import sample_and_score

        out = sample_and_score(
            [{"prompt": p} for p in prompts],
            sampler=sampler,
            runner=lambda prompts, completions, examples, **kw: (np.zeros((len(prompts), 1)), {}),
            params=params,
            group_size=2,
            key=jax.random.key(3),
            max_prompt_len=8,
            pad_id=0,
            chat_template=False,
            prompts_per_call=prompts_per_call,
            first_row=first_row,
        )
        return {
            "tokens": out["completion_ids"].tolist(),
            "logprobs": out["old_logp"].tolist(),
            "calls": out["sample_calls"],
        }
    ro = sampler.generate(prompts, params, num_generations=2, key=jax.random.key(3))
    return {
        "tokens": ro.completion_ids.tolist(),
        "logprobs": ro.logprobs.tolist(),
        "group_ids": ro.group_ids.tolist(),
        "row_offset": ro.info["row_offset"],
        "prompt_ids": ro.prompt_ids.tolist(),
    }


_TIMING = ("time/", "perf/", "reward_time/")


def _register_failing_reward() -> None:
    from gdpo_jax.rewards import list_rewards, register_reward

    if "test_fails_on_p1" in list_rewards():
        return

    @register_reward("test_fails_on_p1")
    def fails_on_p1(prompts, completions, **kw):
        import jax

        if jax.process_index() == 1:
            raise RuntimeError("this reward fails on process 1")
        return [0.5] * len(completions)


def run_loop(
    workdir: str,
    *,
    num_devices: int,
    rows_per_call: int = 0,
    extra_reward: str = "",
    resume: dict | None = None,
) -> list[dict]:
    """Two RL iterations (temperature-1 sampling) + one eval of the
    tiny test task on a (2, 2, 1) mesh; each process samples its own prompts.

    With `resume` (a dict to fill): saves a checkpoint after the two steps, then a new
    Trainer on the workdir resumes from it; `resume` gets its start step, whether its
    key and parameters equal the saved ones, and the checkpoint's key words."""
    import jax

    from gdpo_jax.train.loop import Trainer
    from tests._train_fixtures import tiny_config

    cfg = tiny_config(workdir)
    cfg.mesh.shape = (2, 2, 1)
    cfg.mesh.num_devices = num_devices
    cfg.train.num_steps = 2
    cfg.checkpoint.every = 1 if resume is not None else 0
    cfg.sampling.rows_per_call = rows_per_call
    if extra_reward:
        _register_failing_reward()
        cfg.rewards.names = tuple(cfg.rewards.names) + (extra_reward,)
        cfg.rewards.on_error = "nan"
    # Eval samples like training (temperature 1, 2 prompts x 4 per process):
    # the same compiled sampler, no second compilation.
    cfg.eval.greedy, cfg.eval.temperature, cfg.eval.top_p = False, 1.0, 1.0
    cfg.eval.num_samples = 4
    cfg.train.eval_num_examples = 4
    trainer = Trainer(cfg)
    out = []
    try:
        for step in range(2):
            m = trainer.train_step(step)
            if step == 1:
                m.update(trainer.evaluate())
            out.append({k: float(v) for k, v in m.items() if not k.startswith(_TIMING)})
        if resume is not None:  # as the loop saves after its last step
            ds = {**trainer.stream.get_state(), "records": trainer.records}
            assert trainer.ckpt.save(2, trainer.state, key=trainer.key, data_state=ds, force=True)
    finally:
        trainer.ckpt.close()
        trainer.runner.close()
    if resume is not None:
        import numpy as np

        again = Trainer(cfg)
        try:
            same = jax.tree.map(
                lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))),
                again.state.params,
                trainer.state.params,
            )
            resume.update(
                start_step=again.start_step,
                key_equal=bool(
                    np.array_equal(jax.random.key_data(again.key), jax.random.key_data(trainer.key))
                ),
                params_equal=all(jax.tree.leaves(same)),
                key_data=again.ckpt.read_meta()["key_data"],
            )
        finally:
            again.ckpt.close()
            again.runner.close()
    assert jax.process_count() >= 1
    return out


if __name__ == "__main__":
    main()
