"""The RL loop end to end on a tiny model: metrics, eval, resume-after-kill == uninterrupted."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest

from gdpo_jax.train.loop import Trainer, train
from gdpo_jax.train.metrics import read_jsonl
from tests._train_fixtures import tiny_config

# Wall-clock metrics differ between runs; everything else must match exactly.
_TIMING = ("time/", "perf/", "reward_time/")


def _comparable(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if not k.startswith(_TIMING)}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    wd = str(tmp_path_factory.mktemp("full"))
    cfg = tiny_config(wd)
    cfg.checkpoint.every = 2
    cfg.train.eval_every = 2
    cfg.algo.beta = 0.01  # exercises the reference pass
    cfg.algo.dynamic_sampling = True
    cfg.algo.old_logprobs = "recompute"
    train(cfg)
    return cfg, read_jsonl(os.path.join(wd, "metrics.jsonl"))


def test_loop_writes_metrics(uninterrupted):
    cfg, recs = uninterrupted
    assert sorted(recs) == [1, 2, 3, 4]
    rec = recs[4]
    for key in (
        "reward/test_has_w10/mean",
        "reward/test_short/std",
        "reward/total",
        "adv/mean",
        "adv/std",
        "adv/distinct_per_group",
        "adv/share/test_has_w10",
        "adv/share/test_short",
        "clip_frac",
        "kl",
        "entropy",
        "len/mean",
        "len/truncated_frac",
        "grad_norm",
        "lr",
        "perf/tokens_per_s",
        "time/sample_s",
        "time/reward_s",
        "time/step_s",
        "data/tries",
        "eval/test_short",
        "eval/frac_nonempty",
        "loss",
    ):
        assert key in rec, key
        assert isinstance(rec[key], (int, float)) and not math.isnan(rec[key]), key
    assert "eval/test_short" not in recs[1] and "eval/test_short" in recs[2]
    assert 0.0 <= rec["reward/test_short/mean"] <= 1.0
    ckpts = sorted(os.listdir(os.path.join(cfg.workdir, "checkpoints")))
    assert ckpts == ["2", "4"], ckpts


def test_resume_after_kill_equals_uninterrupted(uninterrupted, tmp_path):
    full_cfg, full = uninterrupted
    wd = str(tmp_path / "killed")
    cfg = tiny_config(wd)
    cfg.checkpoint.every = 2
    cfg.train.eval_every = 2
    cfg.algo.beta = 0.01
    cfg.algo.dynamic_sampling = True
    cfg.algo.old_logprobs = "recompute"
    cfg.train.stop_after_step = 3  # "killed" after step 3: the last checkpoint is step 2
    train(cfg)
    assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["2"]
    cfg.train.stop_after_step = 0
    trainer = Trainer(cfg)
    assert trainer.start_step == 2
    trainer.run()
    assert trainer.step.compile_count() == 1  # steps 3 and 4: one compilation
    resumed = read_jsonl(os.path.join(wd, "metrics.jsonl"))
    assert sorted(resumed) == [1, 2, 3, 4]
    for step in (3, 4):
        assert _comparable(resumed[step]) == _comparable(full[step]), step
    # Run again (a notebook cell rerun), it emptied metrics.jsonl, then failed on its
    # closed reward pool; now it refuses before writing anything.
    from gdpo_jax.errors import RanAlreadyError

    with pytest.raises(RanAlreadyError, match=r"has run already.*new Trainer\(cfg\)"):
        trainer.run()
    assert read_jsonl(os.path.join(wd, "metrics.jsonl")) == resumed


def test_incompatible_checkpoint_names_fields(uninterrupted):
    from gdpo_jax.train.checkpoint import IncompatibleCheckpointError

    cfg = tiny_config(uninterrupted[0].workdir)
    cfg.checkpoint.every = 2
    cfg.train.eval_every = 2
    cfg.algo.dynamic_sampling = True
    cfg.algo.beta = 0.01
    cfg.algo.old_logprobs = "recompute"
    cfg.algo.estimator = "grpo"
    cfg.optim.lr = 1.0
    with pytest.raises(IncompatibleCheckpointError, match=r"algo\.estimator.*\n.*optim\.lr"):
        Trainer(cfg)


def test_rows_per_call_splits_generation(tmp_path):
    # 4 prompts x G 4 = 16 rows, 8 rows per sampler call -> 2 calls per step
    # (and per held-out chunk); the run trains and evaluates as usual. Its decode
    # runs in sampling.decode_phases = 2 phases (6 new tokens: 1 by default) that
    # read a prefix of one cache (sampling.decode_growth; CPU's fused auto: copy).
    cfg = tiny_config(str(tmp_path / "chunked"))
    cfg.sampling.rows_per_call = 8
    cfg.sampling.decode_phases = 2
    cfg.sampling.decode_growth = "prefix"
    cfg.train.num_steps = 2
    # Not a divisor of num_steps: the held-out eval still runs after the last step (a
    # study's "final" values were the last multiple of eval_every's).
    cfg.train.eval_every = 3
    cfg.checkpoint.every = 0
    cfg.eval.greedy, cfg.eval.num_samples = False, 2
    trainer = Trainer(cfg)
    assert trainer.sampler.decode_chunks == 2 and trainer.sampler.decode_growth == "prefix"
    # A sampled eval is the same however rows_per_call (resumable) chunks it: each chunk
    # drew from fold_in(key, chunk start) with rows numbered from 0 in every chunk.
    evals = []
    for rows in (0, 4, 8):
        trainer.cfg.sampling.rows_per_call = rows
        evals.append(trainer.evaluate())
    assert evals[0] == evals[1] == evals[2] and evals[0]["eval/len_mean"] > 0
    trainer.run()
    recs = read_jsonl(os.path.join(cfg.workdir, "metrics.jsonl"))
    assert [recs[s]["data/sample_calls"] for s in (1, 2)] == [2, 2]
    assert math.isfinite(recs[2]["loss"]) and "eval/test_short" in recs[2]
    assert "eval/test_short" not in recs[1]


def _resume_cfg(wd: str):
    cfg = tiny_config(wd)
    cfg.checkpoint.every = 2
    cfg.train.eval_every = 2
    cfg.algo.beta = 0.01
    cfg.algo.dynamic_sampling = True
    cfg.algo.old_logprobs = "recompute"
    return cfg


def test_damaged_latest_checkpoint_resumes_from_previous(uninterrupted, tmp_path):
    import shutil

    from tests.test_checkpoint import _damage

    full_cfg, full = uninterrupted
    wd = str(tmp_path / "damaged")
    shutil.copytree(full_cfg.workdir, wd)
    # The copied metrics hold steps 1-4 already: the resumed run's must be its own.
    os.remove(os.path.join(wd, "metrics.jsonl"))
    _damage(os.path.join(wd, "checkpoints", "4"), "array")
    trainer = Trainer(_resume_cfg(wd))
    assert trainer.start_step == 2  # never 0
    trainer.run()
    resumed = read_jsonl(os.path.join(wd, "metrics.jsonl"))
    for step in (3, 4):
        assert _comparable(resumed[step]) == _comparable(full[step]), step
    assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["2", "4"]


def test_only_checkpoint_damaged_stops_the_run(uninterrupted, tmp_path):
    import shutil

    from gdpo_jax.train.checkpoint import DamagedCheckpointError
    from tests.test_checkpoint import _damage

    wd = str(tmp_path / "damaged1")
    shutil.copytree(uninterrupted[0].workdir, wd)
    shutil.rmtree(os.path.join(wd, "checkpoints", "2"))
    _damage(os.path.join(wd, "checkpoints", "4"), "meta")
    with pytest.raises(DamagedCheckpointError, match=r"step 4 at .*checkpoints/4"):
        Trainer(_resume_cfg(wd))
    assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["4"]


def test_continuous_batching_prompt_buckets_and_fused_old_logp_in_a_run(tmp_path, monkeypatch):
    """The perf options together (continuous-batching sampler growing its cache in
    sampling.decode_phases phases, chunked calls with rewards overlapped,
    recompute-old-log-probs fused into the step): a run trains, and logs the prompt
    width, compile count and overlap timings. The config check once refused
    decode_phases with continuous batching, whose cache grows in phases too."""
    cfg = tiny_config(str(tmp_path / "perf"))
    cfg.sampling.continuous_slots = 4
    cfg.sampling.decode_phases = 2
    cfg.sampling.rows_per_call = 8
    cfg.algo.old_logprobs = "recompute"
    cfg.train.num_steps = 2
    cfg.checkpoint.every = 0
    trainer = Trainer(cfg)
    assert trainer.sampler.continuous_slots == 4 and trainer.sampler.decode_chunks == 2
    # The old log-probs come from the step's own forward: no separate pass, no batch key.
    assert trainer.step_cfg.old_logp_in_step and "old_logp" not in trainer.step.batch_keys
    from gdpo_jax.train import rollout, sample_score

    calls, real = [], rollout.sample_and_score

    def spy(*a, **k):
        calls.append(k.get("overlap_rewards"))
        return real(*a, **k)

    # Each rollout's chunks reach the reward hook as they are generated (the overlap):
    # count the hook's calls per rollout.
    hooked, real_gen = [], sample_score._generate_chunked

    def gen_spy(*a, on_chunk=None, **k):
        starts = []

        def hook(start, rollouts):
            starts.append(start)
            return on_chunk(start, rollouts)

        out = real_gen(*a, on_chunk=None if on_chunk is None else hook, **k)
        if on_chunk is not None:
            hooked.append(starts)
        return out

    monkeypatch.setattr(rollout, "sample_and_score", spy)
    monkeypatch.setattr(sample_score, "_generate_chunked", gen_spy)
    trainer.run()
    assert calls and all(calls)  # every rollout asked for the overlap...
    # ...and scored its chunks one by one, each before the next was generated.
    assert len(hooked) >= cfg.train.num_steps and all(len(s) >= 2 for s in hooked), hooked
    recs = read_jsonl(os.path.join(cfg.workdir, "metrics.jsonl"))
    last = recs[2]  # keyed by step
    assert math.isfinite(last["loss"]) and last["data/prompt_width"] == 8
    assert last["perf/step_compiles"] == 1
    assert "time/reward_wait_s" in last and "time/reward_overlap_s" in last


def test_logprob_passes_run_the_separate_programs_only():
    """Trainer.logprob_passes (run by train_step and by profile_step's timed steps)
    recomputes the old log-probs with the current params only when the step does
    not take them from its own forward; the sampler's log-probs run no pass; the
    reference pass runs only with a reference model outside the step. The caller's
    batch is left as it was."""
    calls = []
    step = SimpleNamespace(logprobs=lambda params, batch: calls.append(params) or params)

    def trainer(old, in_step, ref=None, ref_in_step=False):
        return SimpleNamespace(
            cfg=SimpleNamespace(algo=SimpleNamespace(old_logprobs=old)),
            step_cfg=SimpleNamespace(old_logp_in_step=in_step, ref_logp_in_step=ref_in_step),
            state=SimpleNamespace(params="policy"),
            ref_params=ref,
            step=step,
        )

    batch = {"old_logp": "sampler's"}
    got = Trainer.logprob_passes(trainer("recompute", False), batch)
    assert got["old_logp"] == "policy" and batch["old_logp"] == "sampler's"
    assert calls == ["policy"]
    for t in (trainer("recompute", True), trainer("sampler", False)):
        assert Trainer.logprob_passes(t, batch) == batch
    assert calls == ["policy"]
    got = Trainer.logprob_passes(trainer("sampler", False, ref="reference"), batch)
    assert got == {"old_logp": "sampler's", "ref_logp": "reference"}
    assert Trainer.logprob_passes(trainer("sampler", False, "reference", True), batch) == batch


def test_continuous_batching_on_a_mesh_in_a_run(tmp_path):
    """Continuous batching under a 4-device mesh (fsdp over 4, each batch shard its
    own slots, reading 2 shared prompt slots): a run validates, samples through the
    sharded decoder and trains."""
    cfg = tiny_config(str(tmp_path / "mesh"))
    cfg.mesh.num_devices, cfg.mesh.shape = 4, (1, -1, 1)
    cfg.sampling.continuous_slots = 2
    cfg.sampling.continuous_prompt_slots = 2
    cfg.train.num_steps = 2
    cfg.checkpoint.every = 0
    trainer = Trainer(cfg)
    assert trainer.sampler.mesh is not None and trainer.sampler.continuous_slots == 2
    assert trainer.sampler.continuous_prompt_slots == 2
    trainer.run()
    recs = read_jsonl(os.path.join(cfg.workdir, "metrics.jsonl"))
    assert all(math.isfinite(recs[s]["loss"]) for s in (1, 2))
    assert recs[2]["len/mean"] > 0


def test_metrics_are_flushed_with_every_checkpoint(tmp_path, monkeypatch):
    # A resume starts after its checkpoint and never writes that step's metrics again:
    # what TensorBoard's buffer (or a URL workdir's pending upload) still held when the
    # run was killed was lost for good (13 of a step's 53 scalars in one SIGKILL).
    from gdpo_jax.train.checkpoint import Checkpointer
    from gdpo_jax.train.metrics import MetricsWriter

    events = []
    save, flush = Checkpointer.save, MetricsWriter.flush

    def spy_save(self, step, *a, **k):
        saved = save(self, step, *a, **k)
        events.append(("save", step, saved))
        return saved

    def spy_flush(self):
        events.append(("flush",))
        flush(self)

    monkeypatch.setattr(Checkpointer, "save", spy_save)
    monkeypatch.setattr(MetricsWriter, "flush", spy_flush)
    cfg = tiny_config(str(tmp_path))
    cfg.train.num_steps, cfg.checkpoint.every = 3, 2
    train(cfg)
    saves = [i for i, e in enumerate(events) if e[0] == "save" and e[2]]
    assert [events[i][1] for i in saves] == [2, 3]  # every 2 steps, and the last
    # Before the save: a kill right after a synchronous save lost the step's events.
    assert all(events[i - 1] == ("flush",) for i in saves), events


def test_a_run_resumes_on_another_mesh_with_the_same_numbers(tmp_path):
    # A pod run moved to another allocation: saved on 4 devices (fsdp), resumed on 2
    # (data). An explicit mesh.shape used to be refused as a changed config, leaving only
    # allow_config_change, which switched every other resume check off too.
    def config(workdir, devices, shape):
        cfg = tiny_config(str(workdir))
        cfg.mesh.num_devices, cfg.mesh.shape = devices, shape
        cfg.checkpoint.every = 2
        return cfg

    train(config(tmp_path / "ref", 4, (1, 4, 1)))
    first = config(tmp_path / "moved", 4, (1, 4, 1))
    first.train.stop_after_step = 2
    train(first)
    train(config(tmp_path / "moved", 2, (2, 1, 1)))
    ref = read_jsonl(os.path.join(tmp_path, "ref", "metrics.jsonl"))
    moved = read_jsonl(os.path.join(tmp_path, "moved", "metrics.jsonl"))
    for step in (3, 4):  # the resumed steps: the same prompts, samples and update
        assert moved[step]["reward/total"] == ref[step]["reward/total"], step
        assert math.isclose(moved[step]["loss"], ref[step]["loss"], rel_tol=1e-4, abs_tol=1e-7)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_a_run_whose_update_is_not_finite_stops_before_checkpointing_it(tmp_path):
    # A diverged update (a learning rate of 1e39 overflows f32) was applied and the run
    # went on to the end: NaN loss from the next step, NaN weights in every checkpoint
    # and export, exit status 0.
    from gdpo_jax.errors import NonFiniteUpdateError
    from gdpo_jax.train.checkpoint import Checkpointer

    cfg = tiny_config(str(tmp_path))
    cfg.checkpoint.every = 1
    cfg.train.num_steps = 3
    cfg.optim.lr = 1e39
    with pytest.raises(NonFiniteUpdateError, match=r"step 1: 1 update\(s\) had a non-finite"):
        train(cfg)
    recs = read_jsonl(os.path.join(cfg.workdir, "metrics.jsonl"))
    assert list(recs) == [1] and recs[1]["nonfinite_updates"] == 1
    ckpt = Checkpointer.from_config(cfg)
    assert ckpt.all_steps() == []  # nothing was saved from the refused update
    ckpt.close()


def test_a_sigterm_saves_the_step_in_flight_and_the_resume_equals_uninterrupted(
    uninterrupted, tmp_path, monkeypatch, request
):
    # A preemption notice (SIGTERM) ended the process at once: the steps since the last
    # interval checkpoint were lost. Now the step in flight finishes, is saved (step 3,
    # off the every-2 interval) and the run stops; the resume continues exactly.
    import signal

    from gdpo_jax.errors import PreemptedError

    _, full = uninterrupted
    wd = str(tmp_path / "preempted")
    # The test's own harmless handler: without the run's, the test goes on (and fails).
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    handler = signal.getsignal(signal.SIGTERM)
    request.addfinalizer(lambda: signal.signal(signal.SIGTERM, previous))
    step = Trainer.train_step

    def notice_during_step_3(self, i):
        if i == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # mid-step, as a scheduler sends it
        return step(self, i)

    monkeypatch.setattr(Trainer, "train_step", notice_during_step_3)
    with pytest.raises(PreemptedError, match=r"stopped after step 3 and saved it in .*checkp"):
        train(_resume_cfg(wd))
    assert signal.getsignal(signal.SIGTERM) is handler  # restored
    assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["2", "3"]
    assert sorted(read_jsonl(os.path.join(wd, "metrics.jsonl"))) == [1, 2, 3]
    monkeypatch.setattr(Trainer, "train_step", step)
    trainer = Trainer(_resume_cfg(wd))
    assert trainer.start_step == 3
    trainer.run()
    resumed = read_jsonl(os.path.join(wd, "metrics.jsonl"))
    for i in (3, 4):
        assert _comparable(resumed[i]) == _comparable(full[i]), i


def test_a_sigterm_during_the_last_step_is_handed_on_once_the_run_ends(
    tmp_path, monkeypatch, request
):
    # No step boundary is left to act on it: the run finishes (its final checkpoint
    # saved), then the notice goes on to SIGTERM's previous handler. It was dropped, and
    # a sweep's next run in the process trained on until the SIGKILL.
    import signal

    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    request.addfinalizer(lambda: signal.signal(signal.SIGTERM, previous))
    step = Trainer.train_step

    def notice_during_the_last_step(self, i):
        if i == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(self, i)

    monkeypatch.setattr(Trainer, "train_step", notice_during_the_last_step)
    cfg = tiny_config(str(tmp_path))
    cfg.train.num_steps = 2
    cfg.checkpoint.every = 5
    train(cfg)
    assert received == [signal.SIGTERM]
    assert sorted(os.listdir(os.path.join(cfg.workdir, "checkpoints"))) == ["2"]
