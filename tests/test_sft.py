"""SFT warm start and the synthetic_bpe tokenizer: determinism, round trips, loss, export."""

import hashlib
import json
import logging
import os
import subprocess
import sys
from unittest import mock

import jax
import numpy as np
import pytest

from gdpo_jax.data import tokenizer as T
from gdpo_jax.data.synthetic import make_splits
from gdpo_jax.tasks import math as tm
from gdpo_jax.tasks import toolcall as tc
from gdpo_jax.train import sft as S
from gdpo_jax.train.config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------- tokenizer
def test_tokenizer_is_deterministic_across_processes():
    """Same corpus -> byte-identical tokenizer.json, also in a fresh interpreter
    (Rust hash maps are seeded per process, so in-process equality is not enough)."""
    texts = T.corpus(300, 300)
    here = T.train_bpe(texts, 600).to_str()
    assert here == T.train_bpe(texts, 600).to_str()
    code = (
        "import hashlib; from gdpo_jax.data import tokenizer as T; "
        "print(hashlib.sha256(T.train_bpe(T.corpus(300, 300), 600).to_str().encode()).hexdigest())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    )
    assert out.stdout.strip() == hashlib.sha256(here.encode()).hexdigest()


def test_tokenizer_cache_is_utf8_whatever_the_locale(tmp_path):
    # Under LC_ALL=C (no UTF-8 mode) the cache was written in ASCII: UnicodeEncodeError
    # on the byte-level vocabulary, and a .tmp file left behind.
    code = (
        "from gdpo_jax.data import tokenizer as T; a = T.load_tokenizer(); "
        "T._cached_json.cache_clear(); b = T.load_tokenizer(); "
        "assert a.get_vocab() == b.get_vocab()"
    )
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    env["GDPO_JAX_CACHE"] = str(tmp_path)
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
    (cached,) = tmp_path.glob("synthetic_bpe-*/tokenizer.json")
    assert "\u0120" in cached.read_text(encoding="utf-8")  # "Ġ", byte-level BPE's space
    assert list(tmp_path.rglob("*.tmp")) == []


def test_failed_tokenizer_cache_write_leaves_no_tmp_file(tmp_path, monkeypatch):
    class Unwritable:
        def to_str(self):
            return "\ud800"  # a lone surrogate: no encoding can write it

    monkeypatch.setenv("GDPO_JAX_CACHE", str(tmp_path))
    monkeypatch.setattr(T, "train_bpe", lambda *a, **k: Unwritable())
    T._cached_json.cache_clear()
    with pytest.raises(UnicodeEncodeError):
        T.load_tokenizer(n_toolcall=1, n_math=1)
    T._cached_json.cache_clear()
    assert list(tmp_path.rglob("*.tmp")) == []
    assert list(tmp_path.rglob("tokenizer.json")) == []


def test_tokenizer_layout_and_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("GDPO_JAX_CACHE", str(tmp_path))
    T._cached_json.cache_clear()
    tok = T.load_tokenizer()
    assert 800 <= len(tok) <= T.DEFAULT_VOCAB_SIZE
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    cached = list(tmp_path.glob("synthetic_bpe-*/tokenizer.json"))
    assert len(cached) == 1
    saved = json.loads(cached[0].read_text())
    assert saved["model"]["vocab"] == tok.backend_tokenizer.get_vocab()
    # A second load reads the file: no in-memory copy, and training would fail.
    T._cached_json.cache_clear()

    def no_training(*a, **k):
        raise AssertionError("trained again instead of reading the cached file")

    monkeypatch.setattr(T, "train_bpe", no_training)
    assert T.load_tokenizer().get_vocab() == tok.get_vocab()
    T._cached_json.cache_clear()  # later tests load from their own cache directory
    # Tags are one token each, and survive decoding with specials skipped.
    for tag in T.TAG_TOKENS:
        ids = tok(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, tag
        assert tok.decode(ids, skip_special_tokens=True) == tag
    # Round trip on held-out synthetic records of both tasks (never seen in training).
    recs = (
        make_splits("toolcall", 50, 50, seed=0)["test"]
        + make_splits("arithmetic", 50, 50, seed=0)["test"]
    )
    for r in recs:
        prompt = tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
        assert prompt == T.render_chat(r["prompt"])
        assert prompt.startswith("<s><|") and prompt.endswith("<|assistant|>\n")
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == prompt
        answer = (
            r["reward_model"]["ground_truth"]
            if "<think>" in r["reward_model"]["ground_truth"]
            else r["extra_info"]["solution"]
        )
        ids = tok(answer, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids + [T.EOS_ID], skip_special_tokens=True) == answer
    # Digits are single tokens; arbitrary unicode still round-trips (byte level).
    assert len(tok("12345", add_special_tokens=False)["input_ids"]) == 5
    odd = 'Grüße, 東京! \t\n {"x": -1.5e3}'
    assert tok.decode(tok(odd, add_special_tokens=False)["input_ids"]) == odd
    # The registry name resolves to the same tokenizer.
    from gdpo_jax.data.tokenizer_registry import build_tokenizer

    assert build_tokenizer("synthetic_bpe").get_vocab() == tok.get_vocab()
    # Saved and loaded back, it still pads on the left (set after the constructor, the
    # setting was not written and an export padded on the right).
    from transformers import AutoTokenizer

    assert tok.padding_side == "left"
    back = AutoTokenizer.from_pretrained(T.save_tokenizer(str(tmp_path / "saved")))
    assert back.padding_side == "left"
    assert back(["a", "a b c"], padding=True)["attention_mask"][0][0] == 0
    T._cached_json.cache_clear()


# ------------------------------------------------------------------ targets
def _toolcall_examples(n=80):
    return tc.load(make_splits("toolcall", n, 4, seed=0)["train"])


def test_targets_without_noise_are_the_references():
    ex = _toolcall_examples()
    assert S.make_targets(ex, "toolcall", seed=0) == [e["ground_truth"] for e in ex]
    mx = tm.load(make_splits("arithmetic", 40, 4, seed=0)["train"])
    assert S.make_targets(mx, "math", seed=0) == [e["extra_info"]["solution"] for e in mx]


def test_target_noise_hits_the_intended_reward():
    ex = _toolcall_examples()
    gts = [e["ground_truth"] for e in ex]
    broken = S.make_targets(ex, "toolcall", seed=1, format_noise=1.0)
    assert tc.format_reward(None, broken, ground_truth=gts) == [0.0] * len(ex)
    wrong = S.make_targets(ex, "toolcall", seed=1, value_noise=1.0)
    fmt = tc.format_reward(None, wrong, ground_truth=gts)
    cor = tc.correctness_reward(None, wrong, ground_truth=gts)
    assert fmt == [1.0] * len(ex)  # a wrong value keeps the structure
    with_calls = [c for c, g in zip(cor, gts) if "<tool_call>" in g]
    assert with_calls and all(-3.0 < c < 3.0 for c in with_calls)
    assert S.make_targets(ex, "toolcall", seed=1, value_noise=0.5) == S.make_targets(
        ex, "toolcall", seed=1, value_noise=0.5
    )  # deterministic

    mx = tm.load(make_splits("arithmetic", 40, 4, seed=0)["train"])
    golds = [e["ground_truth"] for e in mx]
    bad = S.make_targets(mx, "math", seed=0, value_noise=1.0)
    assert tm.correctness_reward(None, bad, ground_truth=golds) == [0.0] * len(mx)
    verbose = S.make_targets(mx, "math", seed=0, verbose_prob=1.0)
    assert tm.correctness_reward(None, verbose, ground_truth=golds) == [1.0] * len(mx)
    for v, e in zip(verbose, mx):
        assert v.endswith(e["extra_info"]["solution"]) and len(v) > len(e["extra_info"]["solution"])
        assert "How many" not in v


def test_math_target_noise_on_other_records_names_the_field():
    # The noise assumes the synthetic arithmetic records; on others (the shipped
    # DeepScaleR sample, a fraction answer) it failed with a bare unpack or int() error.
    rec = {
        "prompt": [{"role": "user", "content": "Compute 1/2 + 0."}],
        "extra_info": {"solution": "It is \\boxed{\\frac{1}{2}}"},
    }
    with pytest.raises(ValueError, match=r"sft\.value_noise: record 0.*sft\.value_noise=0"):
        S.make_targets([rec], "math", seed=0, value_noise=1.0)
    with pytest.raises(ValueError, match=r"sft\.verbose_prob: record 0.*sft\.verbose_prob=0"):
        S.make_targets([rec], "math", seed=0, verbose_prob=1.0)


def test_encode_batch_layout():
    b = S.encode_batch(
        [[5, 6], [7]], [[8, 2], [9, 10, 2]], max_prompt_len=3, max_target_len=4, pad_id=0
    )
    np.testing.assert_array_equal(b["prompt_ids"], [[0, 5, 6], [0, 0, 7]])
    np.testing.assert_array_equal(b["prompt_mask"], [[0, 1, 1], [0, 0, 1]])
    np.testing.assert_array_equal(b["completion_ids"], [[8, 2, 0, 0], [9, 10, 2, 0]])
    np.testing.assert_array_equal(b["completion_mask"], [[1, 1, 0, 0], [1, 1, 1, 0]])
    with pytest.raises(ValueError, match="max_new_tokens"):
        S.encode_batch([[1]], [[1] * 5], max_prompt_len=3, max_target_len=4, pad_id=0)


# ---------------------------------------------------------------- training
def _config(workdir, **sft):
    sys.path.insert(0, ROOT)
    from configs.sft_toolcall import get_config

    cfg = get_config("runlocal")
    cfg.workdir = str(workdir)
    cfg.train.progress_bar = False
    cfg.sft.update(dict(num_steps=8, log_every=1, num_examples=16, evaluate=False, **sft))
    cfg.optim.update(dict(lr=3e-3, warmup_steps=0, schedule="constant"))
    return cfg


def _reference_loss(model, batch) -> float:
    """NumPy: full-sequence logits -> log-softmax -> mean -log p of the completion tokens."""
    ids = np.concatenate([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = np.concatenate([batch["prompt_mask"], batch["completion_mask"]], 1)
    logits = np.asarray(model(jax.numpy.asarray(ids), jax.numpy.asarray(mask)), np.float64)
    p = batch["prompt_ids"].shape[1]
    total, count = 0.0, 0
    for b in range(ids.shape[0]):
        for t in range(batch["completion_ids"].shape[1]):
            if batch["completion_mask"][b, t]:
                row = logits[b, p + t - 1]
                lse = row.max() + np.log(np.exp(row - row.max()).sum())
                total += lse - row[ids[b, p + t]]
                count += 1
    return total / count


def test_sft_loss_decreases_matches_reference_and_exports(tmp_path):
    from flax import nnx

    from gdpo_jax.models import load_pretrained
    from gdpo_jax.train.metrics import MetricsWriter, read_jsonl

    cfg = _config(tmp_path / "sft")
    cfg.checkpoint.every = 4
    cfg.sampling.decode_phases = 2  # reach the evaluation's Sampler
    cfg.sampling.decode_growth = "prefix"
    trainer = S.SFT(cfg)
    assert trainer.sampler.decode_chunks == 2 and trainer.sampler.decode_growth == "prefix"
    batch = trainer.batch(0)
    # The compiled loss equals an independent NumPy cross-entropy at init.
    loss0 = S.sft_loss(
        trainer.state.params,
        {k: jax.numpy.asarray(v) for k, v in batch.items()},
        graphdef=trainer.graphdef,
    )[0]
    np.testing.assert_allclose(float(loss0), _reference_loss(trainer.model, batch), rtol=1e-5)
    # Batches are a function of (seed, step): every example once per epoch.
    rows = np.concatenate([trainer.batch(s)["completion_ids"] for s in range(2)])
    assert len({r.tobytes() for r in rows}) == 16
    # On 2 processes each feeds its own half (each fed the whole batch: every row twice
    # in the global batch to_global builds).
    shares = []
    for pi in range(2):
        with (
            mock.patch.object(jax, "process_count", lambda: 2),
            mock.patch.object(jax, "process_index", lambda pi=pi: pi),
        ):
            shares.append(trainer.local_batch(0))
    for k, v in trainer.batch(0).items():
        np.testing.assert_array_equal(np.concatenate([s[k] for s in shares]), v)
        assert len(shares[0][k]) == len(v) // 2

    # Each checkpoint save is preceded by a flush of the metrics a resume from it will
    # not write again.
    events = []
    save, flush = trainer.ckpt.save, MetricsWriter.flush

    def spy_save(step, *a, **k):
        events.append(("save", step, save(step, *a, **k)))
        return events[-1][2]

    def spy_flush(self):
        events.append(("flush",))
        flush(self)

    trainer.ckpt.save = spy_save
    with mock.patch.object(MetricsWriter, "flush", spy_flush):
        result = trainer.run()
    saves = [i for i, e in enumerate(events) if e[0] == "save" and e[2]]
    assert [events[i][1] for i in saves] == [4, 8]
    # Before the save: a kill right after a synchronous save lost the step's events.
    assert all(events[i - 1] == ("flush",) for i in saves), events
    steps = read_jsonl(str(tmp_path / "sft" / "metrics.jsonl"))
    losses = [steps[s]["loss"] for s in range(1, 9)]
    assert all(np.isfinite(losses))
    assert np.mean(losses[-2:]) < 0.8 * np.mean(losses[:2]), losses
    assert trainer._step._cache_size() == 1  # compiled once

    # The HF export loads back with identical logits.
    loaded, tok = load_pretrained(result["hf_dir"])
    assert tok.get_vocab() == trainer.tokenizer.get_vocab()
    ids = jax.numpy.asarray(np.concatenate([batch["prompt_ids"], batch["completion_ids"]], 1))
    mask = jax.numpy.asarray(np.concatenate([batch["prompt_mask"], batch["completion_mask"]], 1))
    np.testing.assert_array_equal(
        np.asarray(loaded(ids, mask)), np.asarray(trainer.model(ids, mask))
    )

    # The orbax checkpoint restores the final state: a rerun resumes at the end.
    again = S.SFT(cfg)
    assert again.start_step == 8
    nnx.update(again.model, again.state.params)
    np.testing.assert_array_equal(
        np.asarray(again.model(ids, mask)), np.asarray(trainer.model(ids, mask))
    )
    # Run again there, it trains nothing and reports the run's last loss (it wrote
    # sft_result.json with train_loss null over the first run's).
    assert again.run()["train_loss"] == result["train_loss"] == losses[-1]


def test_sft_resume_checks_config_and_records_before_the_build(tmp_path, monkeypatch):
    """A resume with a changed config was refused in the restore, after the model build,
    with a traceback (IncompatibleCheckpointError is not a ConfigError); one over other
    training records (batch(step) indexes them) resumed without a word."""
    from gdpo_jax.data.stream import records_fingerprint
    from gdpo_jax.tasks import load_task
    from gdpo_jax.train.checkpoint import Checkpointer
    from gdpo_jax.train.config import ConfigError

    class Built(Exception):
        pass

    def no_build(*a, **k):
        raise Built

    monkeypatch.setattr(S.build, "build_model", no_build)
    cfg = _config(tmp_path / "sft")
    train = load_task(cfg).train[: cfg.sft.num_examples]
    records = {"fingerprint": records_fingerprint(train), "count": len(train)}
    ckpt = Checkpointer.from_config(cfg)
    ckpt.save(
        4,
        {"w": np.zeros(2, np.float32)},
        key=jax.random.key(0),
        data_state={"records": records},
        force=True,
    )
    ckpt.close()
    with pytest.raises(Built):  # the same config and records: on to the build
        S.SFT(cfg)
    changed = _config(tmp_path / "sft")
    changed.optim.lr = 0.5
    with pytest.raises(ConfigError, match="optim.lr: checkpoint=0.003 now=0.5") as e:
        S.SFT(changed)
    assert "\n" not in str(e.value)
    real = S.load_task

    def one_prompt_changed(c):  # the data file edited, the config the same
        task = real(c)
        task.train[3] = dict(task.train[3], edited=True)
        return task

    monkeypatch.setattr(S, "load_task", one_prompt_changed)
    with pytest.raises(ConfigError, match="training records differ") as e:
        S.SFT(cfg)
    assert "\n" not in str(e.value)


def test_sft_config_errors(tmp_path):
    from gdpo_jax.train.config import ConfigError

    cfg = _config(tmp_path, format_noise=1.5)
    with pytest.raises(ConfigError, match="sft.format_noise"):
        S.SFT(cfg)
    cfg = _config("")
    with pytest.raises(ConfigError, match="workdir"):
        S.SFT(cfg)
    # A bad task kwarg fails in validation, before the model build (load_task comes after it).
    cfg = _config(tmp_path)
    with cfg.task.unlocked():
        cfg.task.kwargs = {"n_tools": 0}
    with pytest.raises(ConfigError, match=r"config\.task\.kwargs\.n_tools=0"):
        S._validate(cfg)


def test_sft_input_problems_are_refused_before_the_build(tmp_path, monkeypatch):
    """No held-out records with an eval on (it crashed after all the training, before
    the export), more examples than the task has (fewer trained, without a word),
    targets a record cannot give (a traceback after the build), and a noise the task's
    targets do not have (it did nothing) are one-line ConfigErrors before the build."""
    from gdpo_jax.train.config import ConfigError

    class Built(Exception):
        pass

    def no_build(*a, **k):
        raise Built

    monkeypatch.setattr(S.build, "build_model", no_build)

    def refused(cfg, pattern):
        with pytest.raises(ConfigError, match=pattern) as e:
            S.SFT(cfg)
        assert "\n" not in str(e.value)

    cfg = _config(tmp_path / "a")
    cfg.sft.evaluate, cfg.task.num_eval = True, 0
    refused(cfg, r"no held-out records .* --config\.sft\.evaluate=False")
    cfg = _config(tmp_path / "b")
    cfg.sft.num_examples = 65
    refused(cfg, r"num_examples=65, but the task has 64")
    sys.path.insert(0, ROOT)
    from configs.sft_math import get_config as math_config

    cfg = math_config("runlocal")
    cfg.workdir = str(tmp_path / "c")
    cfg.task.source = os.path.join(ROOT, "gdpo_jax", "data", "samples", "math_deepscaler.jsonl")
    cfg.task.eval_source = cfg.task.source
    refused(cfg, r"SFT targets of 'math': sft\.verbose_prob: record \d+")
    cfg.sft.verbose_prob = 0.0
    with pytest.raises(Built):  # the same file's records give targets without the noise
        S.SFT(cfg)
    cfg.sft.format_noise = 0.5
    refused(cfg, r"sft\.format_noise=0\.5 has no effect on the math task's targets")
    refused(_config(tmp_path / "d", verbose_prob=0.5), r"sft\.verbose_prob=0\.5 has no effect")


@pytest.mark.parametrize(
    "field,value,pattern",
    [
        ("model.dtype", "bf16", r"config\.model\.dtype"),
        ("model.param_dtype", "float16", r"param_dtype='float16': AdamW's moments"),
        ("model.attention", "flash", r"config\.model\.attention='flash' is not one of"),
        ("mesh.axis_types", "bogus", r"config\.mesh\.axis_types='bogus' is not one of"),
        ("mesh.num_devices", 16, r"config\.mesh\.num_devices=16 but \d+ devices exist"),
        ("sampling.max_new_tokens", 300, r"= 412 exceeds the model's context of"),
        ("rewards.names", ("toolcall_fromat",), r"unknown reward 'toolcall_fromat'"),
    ],
)
def test_sft_checks_the_fields_it_shares_with_rl_before_the_build(tmp_path, field, value, pattern):
    # The SFT's validation skipped these: each failed after the model build (a traceback),
    # after the whole training (an unknown reward, at the evaluation), or ran on (past the
    # model's positions; with more devices than exist).
    from gdpo_jax.train.config import ConfigError

    cfg = _config(tmp_path)
    cfg.sft.evaluate = True
    section, key = field.split(".")
    cfg[section][key] = value
    with pytest.raises(ConfigError, match=pattern) as e:
        S._validate(cfg)
    assert "\n" not in str(e.value)


def test_targets_live_in_the_data_layer_and_stay_importable_from_sft():
    from gdpo_jax.data import corrupt
    from gdpo_jax.train.config import ConfigError

    assert S.make_targets is corrupt.make_targets
    with pytest.raises(ValueError, match=r"config.task.name='code'.*'toolcall', 'math'"):
        corrupt.make_targets([], "code", seed=0)
    # The trainer rejects such a task in validation, before building anything.
    cfg = S.sft_config()
    cfg.workdir, cfg.task.name = "/tmp/unused", "code"
    with pytest.raises(ConfigError, match=r"config.task.name='code': SFT targets exist for"):
        S._validate(cfg)


class _NoCheckpoints:
    def save(self, *args, **kwargs) -> bool:
        return False

    def should_save(self, step: int) -> bool:
        return False

    def close(self) -> None:
        pass


@pytest.mark.parametrize("driver", ["sft", "rl"])
def test_every_eval_is_logged_and_the_final_eval_keeps_the_last_loss(tmp_path, driver):
    # An eval on a step log_every skips was run and dropped (eval_every=5, log_every=10:
    # steps 5 and 15 lost). SFT's final eval was a record of its own at the last step, and
    # a step's last record is the one read back: a rerun at the end reported train_loss
    # null. The loops run here on fakes: what they write is what is tested.
    from types import SimpleNamespace

    from gdpo_jax.train.loop import Trainer
    from gdpo_jax.train.metrics import read_jsonl

    cfg = S.sft_config()
    cfg.workdir = str(tmp_path)
    cfg.train.update(num_steps=20, log_every=10, eval_every=5, tensorboard=driver == "sft")
    cfg.train.progress_bar = False
    cfg.sft.update(num_steps=20, log_every=10, eval_every=5, evaluate=True)
    run = object.__new__(S.SFT if driver == "sft" else Trainer)
    run.cfg, run.start_step, run.ckpt = cfg, 0, _NoCheckpoints()
    run.state, run.key, run.records = None, None, {}
    run.evaluate = lambda: {"accuracy": 1.0} if driver == "sft" else {"eval/accuracy": 1.0}
    if driver == "sft":
        run.step = lambda step: {"loss": 0.1 * step, "grad_norm": 2.0 * step}
        run.export, run.num_examples = (lambda: str(tmp_path / "hf")), 4
    else:
        run.train_step = lambda step: {"loss": 0.1 * step, "grad_norm": 2.0 * step}
        run.stream = SimpleNamespace(get_state=dict)
        run.runner = SimpleNamespace(close=lambda: None)
    result = run.run()
    recs = read_jsonl(os.path.join(cfg.workdir, "metrics.jsonl"))
    assert sorted(recs) == [5, 10, 15, 20]
    assert all("eval/accuracy" in recs[s] for s in (5, 10, 15, 20))
    assert recs[20]["loss"] == pytest.approx(1.9)  # the last step's, beside the final eval
    # Rerun at the end (killed after its final checkpoint): a new object's run.
    run.start_step, run._ran = 20, False
    if driver == "sft":
        assert result["train_loss"] == pytest.approx(1.9)
        assert run.run()["train_loss"] == pytest.approx(1.9)  # nothing trains; the last loss
        # The final record keeps the step's training metrics: rebuilt from the loss
        # alone, it lost grad_norm (and lr, tokens) when the final eval was redone.
        again = read_jsonl(os.path.join(cfg.workdir, "metrics.jsonl"))[20]
        assert again["grad_norm"] == pytest.approx(38.0) and again["eval/accuracy"] == 1.0
        # One record per step, after the run and its rerun: the final record replaced the
        # loop's training-only one (two records at step 20, a third after the rerun).
        with open(os.path.join(cfg.workdir, "metrics.jsonl")) as f:
            steps = [json.loads(line)["step"] for line in f]
        assert steps == [5, 10, 15, 20]
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(os.path.join(cfg.workdir, "tb"))
        acc.Reload()
        assert [e.step for e in acc.Scalars("loss/loss")] == [5, 10, 15, 20]
        assert [e.step for e in acc.Scalars("eval/accuracy")] == [5, 10, 15, 20]
    else:
        # The finished run returns its last metrics, as it did when it ran them ({}).
        assert run.run() == {k: v for k, v in recs[20].items() if k != "step"} == result


def test_sft_result_counts_the_examples_it_trains_on(tmp_path, caplog):
    # num_examples was the task's count before the length filter: 16 reported, 7 trained.
    import re

    cfg = _config(tmp_path / "sft")
    cfg.sampling.max_new_tokens = 32  # drops the longer targets
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.sft"):
        trainer = S.SFT(cfg)
    dropped, total = map(int, re.search(r"dropped (\d+) of (\d+) examples", caplog.text).groups())
    assert total == 16 and 0 < dropped < total
    assert trainer.num_examples == total - dropped == len(trainer.data["prompt_ids"])


def test_sft_held_out_eval_splits_its_records_over_the_processes(tmp_path, monkeypatch):
    # Every process sampled every held-out record (P times the work; each process's rows
    # numbered past process 0's, so their samples differed): SFT's eval now scores each
    # chunk through rollout.score_shared, as the RL eval does (that split is tested in
    # tests/test_train_rollout.py); on one process it covers every record once.
    from gdpo_jax.train import rollout

    cfg = _config(tmp_path / "sft", eval_num_examples=3, eval_samples=2)
    cfg.sft.evaluate = True
    cfg.sampling.stop_strings = ("</tool_call>",)
    cfg.sampling.top_k, cfg.sampling.top_p = 7, 0.9
    trainer = S.SFT(cfg)
    calls = []
    real = rollout.score_shared

    def spy(part, group_size, **kw):
        calls.append((len(part), group_size))
        # The stop strings reach the eval's sampling, as in the RL eval (they did not).
        assert kw["params"].stop_strings == ("</tool_call>",)
        # The sampled eval samples as the rollouts do (top-k / top-p were left out).
        p = kw["params"]
        assert (p.top_k, p.top_p, p.temperature) == (7, 0.9, cfg.sampling.temperature)
        assert p.greedy == (group_size == 1)
        return real(part, group_size, **kw)

    monkeypatch.setattr(rollout, "score_shared", spy)
    seen = []  # the task's evaluate gets each row's record (math's pass@1 grouped by
    real_eval = trainer.evaluate_fn  # prompt text, merging records with one prompt)

    def eval_spy(texts, recs, **kw):
        seen.append(kw["group_ids"])
        return real_eval(texts, recs, **kw)

    trainer.evaluate_fn = eval_spy
    out = trainer.evaluate()
    assert seen == [[0, 1, 2], [0, 0, 1, 1, 2, 2]]
    rows = sum(n for n, _ in calls)
    assert rows == 2 * len(trainer.eval_records) == 6  # each record once per mode
    assert {k for _, k in calls} == {1, 2}  # greedy, then 2 samples per record
    assert "greedy/len_mean" in out and "sample/len_mean" in out


def test_sft_eval_drops_held_out_prompts_longer_than_max_prompt_len(tmp_path, caplog):
    """SFT kept every held-out record: a prompt over sampling.max_prompt_len failed the
    first eval (on several processes, one raised and the others waited in a gather for
    minutes, then aborted). Long ones are dropped with a warning, as the RL trainer's,
    before eval_num_examples cuts the list; none left is a config error."""
    cfg = _config(tmp_path / "sft", eval_num_examples=8, eval_samples=1)
    cfg.sft.evaluate = True
    probe = S.SFT(cfg)
    lengths = sorted(
        len(p)
        for p in probe.sampler.encode_prompts(
            [r["prompt"] for r in probe.eval_records], cfg.task.chat_template
        )
    )
    assert lengths[0] < lengths[-1]
    cfg.sampling.max_prompt_len = lengths[len(lengths) // 2]
    with caplog.at_level(logging.WARNING):
        trainer = S.SFT(cfg)
    assert "held-out prompts longer than sampling.max_prompt_len" in caplog.text
    assert len(trainer.eval_records) == sum(n <= cfg.sampling.max_prompt_len for n in lengths)
    fits = trainer.sampler.encode_prompts(
        [r["prompt"] for r in trainer.eval_records], cfg.task.chat_template
    )
    assert max(map(len, fits)) <= cfg.sampling.max_prompt_len
    out = trainer.evaluate()
    assert all(np.isfinite(v) for k, v in out.items() if isinstance(v, float)), out
    cfg.sampling.max_prompt_len = lengths[0] - 1  # every held-out prompt is too long
    with pytest.raises(ConfigError, match=r"max_prompt_len=\d+ leaves no held-out prompt"):
        S.SFT(cfg)


def test_an_sft_update_that_is_not_finite_is_not_applied():
    # SFT applied a non-finite update (rc 0, and its HF export all NaN: the warm start
    # an RL run then loads); it is now kept out, counted, and stops the run.
    import optax

    from gdpo_jax.models import ModelConfig
    from gdpo_jax.models.sharding import create_model
    from gdpo_jax.train import state as state_lib

    cfg = ModelConfig.tiny(vocab_size=32, num_layers=1)
    batch = S.encode_batch(
        [[3, 4]] * 2, [[5, 6, 2]] * 2, max_prompt_len=3, max_target_len=4, pad_id=0
    )
    for scale, bad in ((1.0, 0.0), (float("inf"), 1.0)):
        tx = optax.chain(optax.sgd(1e-2), optax.scale(scale))
        graphdef, state = state_lib.create_train_state(create_model(cfg, seed=0), tx, None)
        before = [np.asarray(x) for x in jax.tree.leaves(state.params)]
        new, metrics = S.sft_step(
            state, batch, graphdef=graphdef, tx=tx, schedule=optax.constant_schedule(1e-2)
        )
        same = [
            np.array_equal(a, np.asarray(b)) for a, b in zip(before, jax.tree.leaves(new.params))
        ]
        assert float(metrics["nonfinite_updates"]) == bad and all(same) == bool(bad)


def test_a_sigterm_saves_the_sft_step_in_flight_and_the_resume_equals_uninterrupted(
    tmp_path, monkeypatch, request
):
    # SFT stops as the RL loop does on a preemption notice: the step in flight is saved
    # (off the checkpoint interval), nothing is exported, and the resume continues it.
    import signal

    from gdpo_jax.errors import PreemptedError
    from gdpo_jax.train.metrics import read_jsonl

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    request.addfinalizer(lambda: signal.signal(signal.SIGTERM, previous))
    full = _config(tmp_path / "full")
    full.sft.num_steps = 4
    S.SFT(full).run()
    cfg = _config(tmp_path / "preempted")
    cfg.sft.num_steps = 4
    cfg.checkpoint.every = 100  # only the final step's, and the notice's
    step = S.SFT.step

    def notice_during_step_2(self, i):
        if i == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(self, i)

    monkeypatch.setattr(S.SFT, "step", notice_during_step_2)
    with pytest.raises(PreemptedError, match="stopped after step 2"):
        S.SFT(cfg).run()
    assert sorted(os.listdir(tmp_path / "preempted" / "checkpoints")) == ["2"]
    assert not (tmp_path / "preempted" / "hf").exists()  # a stopped run exports nothing
    monkeypatch.setattr(S.SFT, "step", step)
    again = S.SFT(cfg)
    assert again.start_step == 2
    again.run()
    losses = [read_jsonl(str(tmp_path / d / "metrics.jsonl")) for d in ("full", "preempted")]
    for i in (3, 4):
        assert losses[1][i]["loss"] == losses[0][i]["loss"], i
    # Run again on the same object, it trained on from the trained weights and logged
    # over the run's steps; now it refuses before writing anything.
    from gdpo_jax.errors import RanAlreadyError

    with pytest.raises(RanAlreadyError, match="this SFT has run already"):
        again.run()
    assert read_jsonl(str(tmp_path / "preempted" / "metrics.jsonl")) == losses[1]
