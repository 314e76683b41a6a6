r"""Supervised warm start: cross-entropy on completion tokens, same model / mesh / ckpt code as RL.

    from gdpo_jax.train.sft import run_sft
    result = run_sft(cfg)  # cfg: configs/sft_toolcall.py; result["hf_dir"] -> RL model.name

The batch has the RL step's layout (left-padded prompt [B, P] + right-padded
completion [B, C]) and the loss reuses its `completion_logprobs`: only the C
positions that predict a completion token are unembedded. Loss = mean over
completion tokens (EOS included) of -log p. One `jax.jit` with explicit
shardings and donation; the state is the RL `TrainState`, checkpointed with
the RL `Checkpointer` (a rerun with the same workdir resumes), and the result
is exported with `gdpo_jax.models.save_pretrained` to `<workdir>/hf`.

Deliberately partial policies: the replica needs a warm start that solves its
task only partly (so RL has something to improve), and the SFT budget is the
knob: `sft.num_steps`, `sft.num_examples` (a subset), and label noise on the
targets (`sft.format_noise`, `sft.value_noise`), plus, for math, verbose
answers (`sft.verbose_prob`) that overrun the length budget. The targets
come from `gdpo_jax.data.corrupt.make_targets` (re-exported here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import time
from typing import Any

import jax
import ml_collections as mlc
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gdpo_jax import compile_cache
from gdpo_jax.data.corrupt import make_targets
from gdpo_jax.data.stream import records_fingerprint
from gdpo_jax.errors import NonFiniteUpdateError, PreemptedError, RanAlreadyError
from gdpo_jax.tasks import load_task
from gdpo_jax.train import build, paths, rollout
from gdpo_jax.train import mesh as mesh_lib
from gdpo_jax.train import state as state_lib
from gdpo_jax.train.checkpoint import Checkpointer
from gdpo_jax.train.config import (
    ConfigError,
    reward_runner,
    reward_specs,
    task_eval_kwargs,
)
from gdpo_jax.train.field_checks import sampling_params
from gdpo_jax.train.metrics import MetricsWriter, read_jsonl
from gdpo_jax.train.preemption import PreemptionWatch
from gdpo_jax.train.records import held_out_records
from gdpo_jax.train.resume_checks import check_resume_config, check_resume_data
from gdpo_jax.train.schema import sft_config  # noqa: F401 - public name, re-exported
from gdpo_jax.train.sft_checks import sft_targets, training_records, validate_sft_config
from gdpo_jax.train.sft_step import encode_batch, sft_loss, sft_step

__all__ = [
    "SFT",
    "encode_batch",
    "make_targets",
    "run_sft",
    "sft_config",
    "sft_loss",
    "sft_step",
]

log = logging.getLogger("gdpo_jax.sft")


# -------------------------------------------------------------------- run
class SFT:
    """Builds model, tokenizer, data and the compiled step from an `sft_config()`;
    `run()` trains, once."""

    _ran = False  # set by `run`: a second call raises before writing anything

    @compile_cache.guarded
    def __init__(self, cfg: mlc.ConfigDict):
        _validate(cfg)
        self.cfg = cfg
        # A resume with a changed config, or over other training records (batch(step)
        # indexes them), stops here in one line, before the model build.
        check_resume_config(cfg)
        task = load_task(cfg)
        train = training_records(cfg, task)
        self.records = {"fingerprint": records_fingerprint(train), "count": len(train)}
        check_resume_data(cfg, self.records["fingerprint"], self.records["count"])
        texts = sft_targets(cfg, train)  # before the model build
        devices = jax.devices()[: cfg.mesh.num_devices or None]
        self.mesh = mesh_lib.make_mesh(
            tuple(cfg.mesh.shape), axis_types=cfg.mesh.axis_types, devices=devices
        )
        mesh_lib.check_batch_divisible(cfg.sft.batch_size, self.mesh, field="config.sft.batch_size")
        if cfg.sft.batch_size % jax.process_count():  # each process feeds its share
            raise ConfigError(
                f"config.sft.batch_size={cfg.sft.batch_size} must be a multiple of the "
                f"{jax.process_count()} processes (each feeds an equal share of a batch)."
            )
        self.model, self.tokenizer = build.build_model(cfg, self.mesh)
        from gdpo_jax.sampling import Sampler

        self.sampler = Sampler(
            self.model,
            self.tokenizer,
            mesh=self.mesh,
            prompt_buckets=(cfg.sampling.max_prompt_len,),
            decode_layers=cfg.sampling.get("decode_layers", "auto"),
            decode_chunks=int(cfg.sampling.get("decode_phases", 0)) or None,
            decode_growth=cfg.sampling.get("decode_growth", "auto"),
            share_prompt_cache=cfg.sampling.get("share_prompt_cache", True),
        )
        # Long held-out prompts dropped (with a warning), as the RL trainer's: one failed
        # the first eval (several processes: one raised, the others hung in a gather).
        encode = functools.partial(
            self.sampler.encode_prompts, chat_template=cfg.task.chat_template
        )
        self.eval_records, _ = held_out_records(
            task.eval, encode, cfg.sampling.max_prompt_len, cfg.sft.eval_num_examples
        )
        if (cfg.sft.evaluate or cfg.sft.eval_every) and not self.eval_records:
            raise ConfigError(
                f"config.sampling.max_prompt_len={cfg.sampling.max_prompt_len} leaves no "
                f"held-out prompt of the task's {len(task.eval)} to evaluate; raise it or set "
                "--config.sft.evaluate=False --config.sft.eval_every=0."
            )
        self.evaluate_fn = task.evaluate
        self.data = self._encode(train, texts)
        # The examples trained on: those the length filter kept (not the task's count).
        self.num_examples = len(next(iter(self.data.values())))
        self.tx, self.schedule = state_lib.make_optimizer(
            cfg.optim, total_updates=cfg.sft.num_steps
        )
        self.graphdef, self.state = state_lib.create_train_state(self.model, self.tx, self.mesh)
        shardings = state_lib.shardings_of(self.state)
        batch_sh = {k: mesh_lib.batch_sharding(self.mesh, 2) for k in self.data}
        self._step = jax.jit(
            functools.partial(sft_step, graphdef=self.graphdef, tx=self.tx, schedule=self.schedule),
            in_shardings=(shardings, batch_sh),
            out_shardings=(shardings, NamedSharding(self.mesh, P())),
            donate_argnums=(0,),
        )
        self.key = jax.random.key(cfg.seed)
        self.ckpt = Checkpointer.from_config(cfg)
        self.start_step = 0
        if self.ckpt.latest_step() is not None:
            self.state, self.key, _, self.start_step = self.ckpt.restore(self.state, self.key)
            log.info("resumed SFT from step %d", self.start_step)

    def _encode(self, records: list[dict], texts: list[str]) -> dict[str, np.ndarray]:
        cfg, tok = self.cfg, self.tokenizer
        prompts = self.sampler.encode_prompts(
            [r["prompt"] for r in records], cfg.task.chat_template
        )
        eos = tok.eos_token_id if tok.eos_token_id is not None else self.model.cfg.eos_token_ids[0]
        targets = [tok(t, add_special_tokens=False)["input_ids"] + [int(eos)] for t in texts]
        keep = [
            i
            for i, (p, t) in enumerate(zip(prompts, targets))
            if len(p) <= cfg.sampling.max_prompt_len and len(t) <= cfg.sampling.max_new_tokens
        ]
        if len(keep) < len(records):
            log.warning(
                "SFT: dropped %d of %d examples longer than max_prompt_len / max_new_tokens",
                len(records) - len(keep),
                len(records),
            )
        if not keep:
            raise ConfigError(
                "config.sampling.max_prompt_len / max_new_tokens leave no SFT example."
            )
        return encode_batch(
            [prompts[i] for i in keep],
            [targets[i] for i in keep],
            max_prompt_len=cfg.sampling.max_prompt_len,
            max_target_len=cfg.sampling.max_new_tokens,
            pad_id=self.sampler.pad_id,
        )

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """Rows of step `step`: an epoch-wise permutation, a function of (seed, step) only."""
        n, b = len(self.data["prompt_ids"]), self.cfg.sft.batch_size
        idx = np.concatenate(
            [
                np.random.default_rng([self.cfg.seed, e]).permutation(n)
                for e in range(step * b // n, (step + 1) * b // n + 1)
            ]
        )
        start = step * b - (step * b // n) * n
        rows = idx[start : start + b]
        return {k: v[rows] for k, v in self.data.items()}

    def local_batch(self, step: int) -> dict[str, np.ndarray]:
        """This process's contiguous share of `batch(step)` (all of it on one process).

        `to_global` stacks the processes' rows: each passing the whole batch made a
        global batch of batch_size x process_count rows, every row process_count
        times (the same loss, process_count times the work).
        """
        rows = self.batch(step)
        pi, pc = jax.process_index(), jax.process_count()
        n = self.cfg.sft.batch_size // pc  # validation: batch_size divides over the mesh
        return {k: v[pi * n : (pi + 1) * n] for k, v in rows.items()}

    @compile_cache.guarded
    def step(self, step: int) -> dict[str, float]:
        from gdpo_jax.train.distributed import to_global

        batch = to_global(self.local_batch(step), self.mesh)
        with jax.set_mesh(self.mesh):
            self.state, metrics = self._step(self.state, batch)
        return {k: float(v) for k, v in metrics.items()}

    @compile_cache.guarded
    def evaluate(self) -> dict[str, float]:
        """Held-out: greedy (1 per prompt) and sampled (k per prompt at the rollouts'
        sampling: temperature, top_k, top_p)."""
        cfg = self.cfg
        nnx.update(self.model, self.state.params)
        out: dict[str, float] = {}
        specs = reward_specs(cfg)
        with reward_runner(cfg, specs) as runner:
            for mode, k in (("greedy", 1), ("sample", max(cfg.sft.eval_samples, 1))):
                # The rollouts' params (temperature, top-k, top-p, stop strings): a
                # hand-built copy left out top-k / top-p and, once, the stop strings.
                params = dataclasses.replace(sampling_params(cfg), greedy=mode == "greedy")
                chunk = max(cfg.sft.batch_size // k, 1)
                texts, recs, rewards, lengths, gids = [], [], [], [], []
                for i in range(0, len(self.eval_records), chunk):
                    part = self.eval_records[i : i + chunk]
                    # Each process samples its share: every process sampled every
                    # prompt, P times the work and rows numbered past process 0's.
                    res = rollout.score_shared(
                        part,
                        k,
                        sampler=self.sampler,
                        runner=runner,
                        params=params,
                        # One key, rows by their place: the same whatever the chunks.
                        key=jax.random.fold_in(jax.random.key(cfg.seed + 1), 0),
                        first_record=i,
                        max_prompt_len=cfg.sampling.max_prompt_len,
                        pad_id=self.sampler.pad_id,
                        chat_template=cfg.task.chat_template,
                    )
                    texts += res["texts"]
                    recs += [part[j // k] for j in range(len(part) * k)]
                    # The record each row answers: by prompt text, math's pass@1 merged
                    # distinct records with the same prompt.
                    gids += [i + j // k for j in range(len(part) * k)]
                    rewards.append(res["rewards"])
                    lengths += [int(x) for x in res["lengths"]]
                r = np.concatenate(rewards)
                for j, sp in enumerate(specs):
                    out[f"{mode}/{sp.name}"] = float(np.nanmean(r[:, j]))
                out[f"{mode}/len_mean"] = float(np.mean(lengths))
                if self.evaluate_fn is not None:
                    extra = self.evaluate_fn(
                        texts,
                        recs,
                        completion_lengths=lengths,
                        group_ids=gids,
                        **task_eval_kwargs(cfg, specs),
                    )
                    out.update({f"{mode}/{n}": float(v) for n, v in extra.items()})
                out[f"{mode}/example"] = texts[0]  # type: ignore[assignment]
        return out

    def export(self, out_dir: str | None = None) -> str:
        from gdpo_jax.models import save_pretrained

        nnx.update(self.model, self.state.params)
        return save_pretrained(
            self.model, self.tokenizer, out_dir or os.path.join(self.cfg.workdir, "hf")
        )

    @compile_cache.guarded
    def run(self) -> dict[str, Any]:
        """Trains, evaluates, exports.

        Returns {"hf_dir", "eval", "train_loss", "num_examples", "seconds"}.
        """
        if self._ran:  # a notebook cell run again: nothing is written
            raise RanAlreadyError.of("SFT")
        self._ran = True
        cfg, s = self.cfg, self.cfg.sft
        writer = MetricsWriter(
            cfg.workdir,
            total_steps=s.num_steps,
            initial_step=self.start_step,
            resume_step=self.start_step,  # drops what a killed attempt logged past it
            tensorboard=cfg.train.tensorboard,
            progress_bar=cfg.train.progress_bar,
            enabled=jax.process_index() == 0,
        )
        t0, last, ev = time.perf_counter(), {}, {}
        # SIGTERM saves the step in flight and stops (a run that checkpoints nothing dies).
        preemption = PreemptionWatch(enabled=cfg.checkpoint.every > 0).start()
        try:
            for step in range(self.start_step, s.num_steps):
                metrics = self.step(step)
                done = step + 1
                if metrics.get("nonfinite_updates", 0) > 0:
                    writer.write(done, metrics)
                    raise NonFiniteUpdateError.at_step(done, metrics, self.ckpt.latest_step())
                evaluated = bool(s.eval_every) and done % s.eval_every == 0 and done < s.num_steps
                if evaluated:
                    metrics.update(
                        {
                            f"eval/{k}": v
                            for k, v in self.evaluate().items()
                            if not k.endswith("example")
                        }
                    )
                # A step that evaluated is written whatever log_every says: its eval was lost.
                if done % max(s.log_every, 1) == 0 or done == s.num_steps or evaluated:
                    writer.write(done, metrics)
                last = metrics
                # A preemption notice saves this step, off the interval too, and stops.
                preempted = done < s.num_steps and preemption.reached(done)
                force = (done == s.num_steps and cfg.checkpoint.every > 0) or preempted
                if force or self.ckpt.should_save(done):
                    # Before the save: what a resume from this checkpoint will not write
                    # again (a kill right after a synchronous save lost its events).
                    writer.flush()
                self.ckpt.save(
                    done,
                    self.state,
                    key=self.key,
                    data_state={"records": self.records},
                    force=force,
                )
                if preempted:
                    raise PreemptedError.at_step(done, self.ckpt.directory)
            if "loss" not in last and self.start_step and jax.process_index() == 0:
                # Resumed at the end: the last step's training metrics are in the run's
                # records, not here (sft_result.json was rewritten with train_loss null;
                # rebuilt from the loss alone, the final record lost grad_norm, lr, ...).
                writer.flush()
                logged = read_jsonl(paths.join(cfg.workdir, "metrics.jsonl"))
                rec = logged.get(self.start_step, {"loss": None})
                last = {k: v for k, v in rec.items() if k != "step" and not k.startswith("eval/")}
            if s.evaluate:
                ev = self.evaluate()
                # One record for the last step, its training metrics and the final eval: a
                # step's last record is the one read back, and an eval-only one hid the loss.
                # It replaces the training-only record the loop wrote (appended, the step
                # had two records, and each rerun of the finished run added one more).
                final = {f"eval/{k}": v for k, v in ev.items() if not k.endswith("example")}
                writer.replace(s.num_steps, {**last, **final})
        finally:
            with contextlib.ExitStack() as closing:  # the writer closes even if the save failed
                closing.callback(preemption.stop)  # last: SIGTERM is handled until the save ends
                closing.callback(writer.close)
                self.ckpt.close()
        hf_dir = self.export()
        result = {
            "hf_dir": hf_dir,
            "eval": ev,
            "train_loss": last.get("loss"),
            "num_examples": self.num_examples,
            "seconds": time.perf_counter() - t0,
        }
        if jax.process_index() == 0:
            with open(os.path.join(cfg.workdir, "sft_result.json"), "w") as f:
                json.dump(result, f, indent=2)
        return result


_validate = validate_sft_config


def run_sft(cfg: mlc.ConfigDict) -> dict[str, Any]:
    """Builds an `SFT` from the config and runs it (see `SFT.run`); on several CPU
    devices it compiles every program afresh unless XLA_FLAGS carries the ordered
    scheduler (`compile_cache.cache_is_safe`; SFT's methods are
    `compile_cache.guarded`)."""
    return SFT(cfg).run()
