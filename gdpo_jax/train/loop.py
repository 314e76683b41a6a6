"""The RL loop: prompts -> sampler -> rewards -> compiled step -> metrics/eval/ckpt.

    from gdpo_jax.train.loop import train
    final_metrics = train(config)          # config from configs/*.py

Resuming is automatic: when `<workdir>/checkpoints` holds a checkpoint, the
train state, PRNG key and data iterator are restored and the run continues
with exactly the batches it would have seen (each step's sampling key is
`fold_in(key, step)`), so its metrics equal an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import logging
import time
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gdpo_jax import compile_cache
from gdpo_jax.data.stream import PromptStream, records_fingerprint
from gdpo_jax.errors import NonFiniteUpdateError, PreemptedError, RanAlreadyError
from gdpo_jax.train import build, distributed, paths, rollout
from gdpo_jax.train import mesh as mesh_lib
from gdpo_jax.train import state as state_lib
from gdpo_jax.train.checkpoint import Checkpointer
from gdpo_jax.train.config import (
    check_context_length,
    eval_params,
    prompt_buckets,
    prompts_per_call,
    reward_runner,
    reward_specs,
    sampling_params,
    task_eval_kwargs,
    validate_config,
)
from gdpo_jax.train.metrics import MetricsWriter, read_jsonl
from gdpo_jax.train.preemption import PreemptionWatch
from gdpo_jax.train.records import usable_records
from gdpo_jax.train.resume_checks import check_resume_data
from gdpo_jax.train.step import CompiledStep, StepConfig
from gdpo_jax.train.step_config import check_group_prompts, share_prompt_blocker

log = logging.getLogger("gdpo_jax.train")


def _host_float(x: Any) -> float:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = x.addressable_data(0)  # replicated scalar
    return float(np.asarray(x))


def _gather_rows(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """All hosts' rows (for metrics); identity on one process."""
    if jax.process_count() == 1:
        return arrays
    # Through the byte-exact host allgather (equal row counts): process_allgather's
    # device_put made int64 / float64 rows int32 / float32 with more than one process.
    out = {}
    for k, v in arrays.items():
        g = distributed.allgather_host(np.asarray(v))  # [P, rows, ...]
        out[k] = g.reshape((g.shape[0] * g.shape[1],) + g.shape[2:]) if g.ndim > 1 else g
    return out


class Trainer:
    """Everything one run needs, built from a validated config. `run()` trains, once."""

    _ran = False  # set by `run`: a second call raises before writing anything

    @compile_cache.guarded
    def __init__(self, cfg, *, task: build.TaskData | None = None):
        validate_config(cfg)
        # Paths too, before the model is built (the CLI checks them; train() from Python
        # met a missing data path only after the build).
        paths.check_inputs(cfg, data=task is None)
        self.cfg = cfg
        pi, pc = build.process_info()
        self.local_prompts = cfg.algo.num_prompts // pc
        self.group_offset = pi * self.local_prompts
        self.prompts_per_call = prompts_per_call(cfg, pc)
        devices = jax.devices()[: cfg.mesh.num_devices or None]
        self.mesh = mesh_lib.make_mesh(
            tuple(cfg.mesh.shape), axis_types=cfg.mesh.axis_types, devices=devices
        )
        shards = mesh_lib.batch_axis_size(self.mesh)
        self.step_cfg = StepConfig.from_config(cfg, batch_shards=shards)
        if cfg.algo.share_prompt and not self.step_cfg.share_prompt:
            a = cfg.algo
            log.info(
                "algo.share_prompt is off for this run: %s",
                share_prompt_blocker(a.num_prompts, a.num_minibatches * a.num_microbatches, shards),
            )
        # Prompt widths of the sampler and the step (one step compilation each).
        self.prompt_buckets = prompt_buckets(cfg)
        # The records before the model: a bad task setting fails in seconds, not after
        # the build.
        self.task = task or build.load_task(cfg)
        # What the stream's checkpointed position indexes: a resume over changed records
        # stops here, before the model build (resume_checks.check_resume_data).
        self.records = {
            "fingerprint": records_fingerprint(self.task.train),
            "count": len(self.task.train),
        }
        check_resume_data(cfg, self.records["fingerprint"], self.records["count"])
        self.model, self.tokenizer = build.build_model(cfg, self.mesh)
        # validate_config cannot read a GGUF name's position table before loading it.
        check_context_length(cfg, self.model.cfg.context_length)
        from gdpo_jax.sampling import Sampler

        self.sampler = Sampler(
            self.model,
            self.tokenizer,
            mesh=self.mesh,
            prompt_buckets=self.prompt_buckets,
            continuous_slots=int(cfg.sampling.get("continuous_slots", 0)),
            decode_layers=cfg.sampling.get("decode_layers", "auto"),
            decode_chunks=int(cfg.sampling.get("decode_phases", 0)) or None,
            decode_growth=cfg.sampling.get("decode_growth", "auto"),
            share_prompt_cache=cfg.sampling.get("share_prompt_cache", True),
            continuous_prompt_slots=int(cfg.sampling.get("continuous_prompt_slots", 0)),
        )
        self.sampling_params = sampling_params(cfg)
        self.eval_params = eval_params(cfg)

        self.specs = reward_specs(cfg)
        self.task_eval_kwargs = task_eval_kwargs(cfg, self.specs)  # the task's evaluate(**...)
        self.reward_names = [sp.name for sp in self.specs]
        self.weights = [sp.weight for sp in self.specs]

        train_records, self.eval_records, self.prompts_dropped = usable_records(
            cfg,
            self.task.train,
            self.task.eval,
            lambda prompts: self.sampler.encode_prompts(prompts, cfg.task.chat_template),
            pc,
        )
        self.stream = PromptStream(train_records, seed=cfg.seed, process_index=pi, process_count=pc)

        sc = self.step_cfg
        self.tx, self.schedule = state_lib.rl_optimizer(cfg, sc.updates_per_step)
        self.graphdef, self.state = state_lib.create_train_state(self.model, self.tx, self.mesh)
        self.step = CompiledStep(
            graphdef=self.graphdef,
            tx=self.tx,
            schedule=self.schedule,
            cfg=sc,
            state_shardings=state_lib.shardings_of(self.state),
            mesh=self.mesh,
        )
        self.ref_params = None
        if sc.needs_ref:
            # Frozen copy of the initial policy, placed like the policy.
            copy = jax.jit(
                lambda p: jax.tree.map(jnp.copy, p),
                out_shardings=state_lib.shardings_of(self.state.params),
            )
            with jax.set_mesh(self.mesh):
                self.ref_params = copy(self.state.params)
        self.key = jax.random.key(cfg.seed)
        self.ckpt = Checkpointer.from_config(cfg)
        self.start_step = 0
        if self.ckpt.latest_step() is not None:
            self.state, self.key, data_state, self.start_step = self.ckpt.restore(
                self.state, self.key
            )
            if data_state:
                data_state = dict(data_state)
                data_state.pop("records", None)  # checked above (check_resume_data)
                self.stream.set_state(data_state)
            nnx.update(self.model, self.state.params)
            log.info("resumed from step %d", self.start_step)
        # Last: its worker pool (threads or processes) is up from here on, and every
        # error above would have left it running.
        self.runner = reward_runner(cfg, self.specs)

    # ------------------------------------------------------------------ parts
    def _collect(self, step: int) -> tuple[dict, dict]:
        cfg = self.cfg
        return rollout.collect_batch(
            self.stream,
            num_prompts=self.local_prompts,
            group_size=cfg.algo.group_size,
            key=jax.random.fold_in(self.key, step),
            dynamic=cfg.algo.dynamic_sampling,
            max_tries=cfg.algo.dynamic_sampling_max_tries,
            decoupled=cfg.algo.estimator.startswith("gdpo"),
            weights=self.weights,
            nan_rewards=cfg.algo.nan_rewards,
            group_offset=self.group_offset,
            sampler=self.sampler,
            runner=self.runner,
            params=self.sampling_params,
            max_prompt_len=cfg.sampling.max_prompt_len,
            prompt_buckets=self.prompt_buckets,
            pad_id=self.sampler.pad_id,
            chat_template=cfg.task.chat_template,
            prompts_per_call=self.prompts_per_call,
            overlap_rewards=bool(cfg.rewards.get("overlap", True)),
        )

    def logprob_passes(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """The batch with the log-prob passes run before the step, each a separate
        program unless the step takes it from its own forward: the old log-probs
        recomputed with the current params (`algo.old_logprobs="recompute"`,
        `"old_logp"` [N, C]) and, with a reference model, the reference's
        (`"ref_logp"` [N, C]). The caller's dict is left as it is."""
        batch = dict(batch)
        if self.cfg.algo.old_logprobs == "recompute" and not self.step_cfg.old_logp_in_step:
            batch["old_logp"] = self.step.logprobs(self.state.params, batch)
        if self.ref_params is not None and not self.step_cfg.ref_logp_in_step:
            batch["ref_logp"] = self.step.logprobs(self.ref_params, batch)
        return batch

    @compile_cache.guarded
    def train_step(self, step: int) -> dict[str, float]:
        """One RL iteration (step = number of steps done before it)."""
        t0 = time.perf_counter()
        arrays, info = self._collect(step)
        t1 = time.perf_counter()
        if self.step_cfg.share_prompt:  # cheap: [N, P] ints, on the host
            check_group_prompts(
                arrays["prompt_ids"], arrays["prompt_mask"], self.cfg.algo.group_size
            )
        batch = self.logprob_passes(distributed.to_global(arrays, self.mesh))
        self.state, dev_metrics = self.step(self.state, batch, self.ref_params)
        nnx.update(self.model, self.state.params)  # the sampler reads the new weights
        metrics = {k: _host_float(v) for k, v in dev_metrics.items()}
        t2 = time.perf_counter()

        # Per-row lengths cross processes, not the [N, C] / [N, P] masks.
        rows = _gather_rows(rollout.row_stats(arrays, info["finish"]))
        finish = ["length" if t else "eos" for t in rows["truncated"]]
        metrics.update(rollout.rollout_metrics(rows, finish, self.reward_names, self.weights))
        tokens = float(((rows["completion_len"] + rows["prompt_len"]) * rows["valid"]).sum())
        metrics.update(
            {
                "data/sample_calls": info["sample_calls"],
                # The bucketed prompt width of this batch, and step programs so far.
                "data/prompt_width": arrays["prompt_ids"].shape[1],
                "perf/step_compiles": self.step.compile_count(),
                "time/step_s": t2 - t1,
                "time/iter_s": t2 - t0,
                "perf/tokens_per_s": tokens / max(t2 - t0, 1e-9),
                "perf/step_tokens_per_s": tokens / max(t2 - t1, 1e-9),
                # Over all processes (tries are in lock step across them).
                "data/valid_groups_frac": distributed.sum_processes(info["valid_groups"])
                / self.cfg.algo.num_prompts,
            }
        )
        if self.cfg.algo.dynamic_sampling:
            metrics["data/tries"] = info["tries"]
            metrics["data/kept_groups_frac"] = distributed.sum_processes(info["kept_groups"]) / max(
                distributed.sum_processes(info["scored_groups"]), 1
            )
        reduce = None
        if jax.process_count() > 1:
            # Failures anywhere are counted (summed); times are the slowest host's.
            reduce = partial(distributed.reduce_processes, max_prefixes=("time/", "reward_time/"))
        host = rollout.host_metrics(info, reduce)
        metrics.update(host)
        return metrics

    @compile_cache.guarded
    def evaluate(self) -> dict[str, float]:
        """Held-out split: the config's eval sampling, rewards and the task's own metrics.

        With several processes each scores a contiguous share of every chunk
        (`rollout.score_shared`), so every process computes the same metrics as one.
        """
        if not self.eval_records:
            return {}
        cfg, k = self.cfg, max(int(self.cfg.eval.num_samples), 1)
        call_rows = (
            int(cfg.sampling.get("rows_per_call", 0)) or cfg.algo.num_prompts * cfg.algo.group_size
        )
        chunk = max(call_rows // k, 1)  # held-out prompts per sampler call
        texts, recs, rewards, lengths, gids = [], [], [], [], []
        key = jax.random.fold_in(jax.random.key(cfg.seed + 1), 0)
        for i in range(0, len(self.eval_records), chunk):
            part = self.eval_records[i : i + chunk]
            out = rollout.score_shared(
                part,
                k,
                sampler=self.sampler,
                runner=self.runner,
                params=self.eval_params,
                key=key,  # one key, rows by their place: the same whatever the chunks
                first_record=i,
                max_prompt_len=cfg.sampling.max_prompt_len,
                prompt_buckets=self.prompt_buckets,
                pad_id=self.sampler.pad_id,
                chat_template=cfg.task.chat_template,
            )
            rows = len(part) * k
            texts += out["texts"]
            recs += [part[j // k] for j in range(rows)]
            gids += [i + j // k for j in range(rows)]
            rewards.append(out["rewards"])
            lengths.append(out["lengths"])
        r = np.concatenate(rewards)
        metrics = {f"eval/{n}": float(np.nanmean(r[:, j])) for j, n in enumerate(self.reward_names)}
        metrics["eval/len_mean"] = float(np.concatenate(lengths).mean())
        if self.task.evaluate is not None:
            extra = self.task.evaluate(
                texts,
                recs,
                completion_lengths=[int(x) for x in np.concatenate(lengths)],
                group_ids=gids,
                **self.task_eval_kwargs,
            )
            metrics.update({f"eval/{n}": float(v) for n, v in extra.items()})
        return metrics

    # ------------------------------------------------------------------- run
    @compile_cache.guarded
    def run(self) -> dict[str, float]:
        if self._ran:  # a notebook cell run again: nothing is written
            raise RanAlreadyError.of("Trainer")
        self._ran = True
        cfg = self.cfg
        if self.start_step >= cfg.train.num_steps:
            log.info(
                "already finished: the checkpoint in %s is at step %d of train.num_steps=%d; "
                "nothing to do (raise --config.train.num_steps to continue, or use a new workdir)",
                cfg.workdir,
                self.start_step,
                cfg.train.num_steps,
            )
            self.ckpt.close()
            self.runner.close()
            # The last step's metrics, as the finished run returned them (a run killed
            # after its final checkpoint returned {} when started again).
            path = paths.join(cfg.workdir, "metrics.jsonl")
            rec = read_jsonl(path).get(self.start_step, {}) if paths.exists(path) else {}
            return {k: v for k, v in rec.items() if k != "step"}
        writer = MetricsWriter(
            cfg.workdir,
            total_steps=cfg.train.num_steps,
            initial_step=self.start_step,
            resume_step=self.start_step,  # drops what a killed attempt logged past it
            tensorboard=cfg.train.tensorboard,
            progress_bar=cfg.train.progress_bar,
            enabled=jax.process_index() == 0,
        )
        last: dict[str, float] = {}
        # SIGTERM saves the step in flight and stops (a run that checkpoints nothing dies).
        preemption = PreemptionWatch(enabled=cfg.checkpoint.every > 0).start()
        try:
            for step in range(self.start_step, cfg.train.num_steps):
                metrics = self.train_step(step)
                done = step + 1
                if metrics.get("nonfinite_updates", 0) > 0:
                    writer.write(done, metrics)  # the step's metrics show where it went
                    raise NonFiniteUpdateError.at_step(done, metrics, self.ckpt.latest_step())
                # And after the last step: a study's "final" held-out values were the last
                # multiple of eval_every's otherwise.
                end = done == cfg.train.num_steps
                evaluated = bool(cfg.train.eval_every) and (done % cfg.train.eval_every == 0 or end)
                if evaluated:
                    metrics.update(self.evaluate())
                # A step that evaluated is written whatever log_every says: its eval was lost.
                if done % max(cfg.train.log_every, 1) == 0 or end or evaluated:
                    writer.write(done, metrics)
                last = metrics
                ds = {**self.stream.get_state(), "records": self.records}
                # A preemption notice saves this step, off the interval too, and stops.
                preempted = not end and preemption.reached(done)
                force = (end and cfg.checkpoint.every > 0) or preempted
                if force or self.ckpt.should_save(done):
                    # Before the save: a resume from this step never writes its metrics
                    # again, and a kill right after a synchronous save lost its events.
                    writer.flush()
                self.ckpt.save(done, self.state, key=self.key, data_state=ds, force=force)
                if preempted:
                    raise PreemptedError.at_step(done, self.ckpt.directory)
                if cfg.train.stop_after_step and done >= cfg.train.stop_after_step:
                    log.info("stop_after_step=%d reached; exiting", done)
                    break
        finally:
            # Each closes even when one before it raises (a failed final async save raises
            # from ckpt.close): the metrics reach disk and the reward pool stops.
            with contextlib.ExitStack() as closing:
                closing.callback(preemption.stop)  # last: SIGTERM is handled until the save ends
                closing.callback(self.runner.close)
                closing.callback(writer.close)
                self.ckpt.close()
        return last


def train(cfg, *, task: build.TaskData | None = None) -> dict[str, float]:
    """Builds a Trainer for `cfg` and runs it; returns the last step's metrics.

    On several CPU devices it compiles every program afresh unless XLA_FLAGS carries
    the ordered scheduler (`compile_cache.cache_is_safe`; Trainer's methods are
    `compile_cache.guarded`)."""
    return Trainer(cfg, task=task).run()
