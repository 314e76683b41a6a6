"""Dynamic sampling on the host: per-reward spread under GDPO, refill, invalid padding."""

from __future__ import annotations

import time
import types

import jax
import numpy as np
import pytest

from gdpo_jax.data.stream import PromptStream
from gdpo_jax.train.rollout import collect_batch, group_has_signal, rollout_metrics

G = 2


def test_group_signal_per_reward_vs_sum():
    # Rewards trade off: the sum is constant, each reward has spread.
    r = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert group_has_signal(r, decoupled=True)
    assert not group_has_signal(r, decoupled=False)
    assert group_has_signal(r, decoupled=False, weights=[1.0, 2.0])
    assert not group_has_signal(np.array([[1.0, 0.5], [1.0, 0.5]]), decoupled=True)
    # NaN is unscorable: one scorable value is no spread.
    assert not group_has_signal(np.array([[np.nan, 1.0], [0.0, 1.0]]), decoupled=True)


class FakeSampler:
    """Completion text = the prompt; token ids are irrelevant here."""

    def generate(self, prompts, params, *, num_generations, key, chat_template, first_row=0):
        n = len(prompts) * num_generations
        gid = np.repeat(np.arange(len(prompts)), num_generations).astype(np.int32)
        return types.SimpleNamespace(
            prompt_ids=np.ones((n, 3), np.int32),
            prompt_mask=np.ones((n, 3), np.int32),
            completion_ids=np.ones((n, 4), np.int32),
            completion_mask=np.ones((n, 4), np.int32),
            logprobs=np.zeros((n, 4), np.float32),
            lengths=np.full(n, 4),
            group_ids=gid,
            finish_reason=["length"] * n,
            texts=[prompts[g] for g in gid],
            info={"batch_rows": n},
        )


def fake_runner(prompts, completions, examples, **kw):
    """Prompt "s<k>" -> row j of its group scores (j, -j) when k is odd (spread in each
    reward, constant sum), else constant (no signal)."""
    out = []
    for i, c in enumerate(completions):
        k, j = int(c[1:]), i % G
        out.append([j, -j] if k % 2 else [1.0, 1.0])
    return np.asarray(out, np.float32), {"reward_time/a": 0.1}


def _collect(decoupled, max_tries, dynamic=True):
    stream = PromptStream([{"prompt": f"s{k}"} for k in range(40)], seed=0)
    return collect_batch(
        stream,
        num_prompts=4,
        group_size=G,
        key=jax.random.key(0),
        dynamic=dynamic,
        max_tries=max_tries,
        decoupled=decoupled,
        group_offset=10,
        sampler=FakeSampler(),
        runner=fake_runner,
        params=None,
        max_prompt_len=5,
        pad_id=0,
    )


def test_dynamic_sampling_refills_with_signal_groups():
    arrays, info = _collect(decoupled=True, max_tries=10)
    assert arrays["valid"].all() and info["valid_groups"] == 4 and info["tries"] >= 2
    # Every kept group has spread in reward 0 (odd prompts only).
    assert (np.ptp(arrays["rewards"].reshape(4, G, 2)[:, :, 0], axis=1) > 0).all()
    np.testing.assert_array_equal(arrays["group_ids"], np.repeat(np.arange(10, 14), G))
    assert arrays["prompt_ids"].shape == (8, 5)  # left padded to max_prompt_len
    assert (arrays["prompt_ids"][:, :2] == 0).all()
    assert info["reward_info"]["reward_time/a"] == 0.1 * info["tries"]


def test_dynamic_sampling_grpo_keeps_nothing_and_pads_invalid():
    # Under GRPO the summed reward is constant in every group: no group is kept;
    # the batch is filled with dropped groups marked invalid, same shapes.
    arrays, info = _collect(decoupled=False, max_tries=2)
    assert info["tries"] == 2 and info["valid_groups"] == 0 and not arrays["valid"].any()
    assert arrays["rewards"].shape == (8, 2)
    m = rollout_metrics(arrays | {"valid": np.ones(8, bool)}, ["length"] * 8, ["a", "b"], None)
    assert m["len/truncated_frac"] == 1.0 and m["len/mean"] == 4.0
    # With no valid row every metric is NaN, as the per-reward means: a finite 0.0 total
    # (and lengths) was averaged into the plotted curves as a reward of 0.
    m = rollout_metrics(arrays, ["length"] * 8, ["a", "b"], None)
    for key in (
        *("reward/total", "reward/a/mean", "reward/a/nan_frac"),
        *("len/mean", "len/max", "len/truncated_frac"),
    ):
        assert np.isnan(m[key]), key


def test_without_dynamic_sampling_every_group_is_kept_unjudged(monkeypatch):
    """Dynamic sampling off: one try keeps every group, signal or not, and the
    spread check (host work between two device programs) is not run at all."""
    from gdpo_jax.train import rollout

    def judged(*a, **k):
        raise AssertionError("groups_with_signal ran with dynamic sampling off")

    monkeypatch.setattr(rollout, "groups_with_signal", judged)
    arrays, info = _collect(decoupled=True, max_tries=10, dynamic=False)
    assert info["tries"] == 1 and info["valid_groups"] == info["kept_groups"] == 4
    assert arrays["valid"].all()
    # The first 4 prompts of the stream, in order, whatever their rewards' spread.
    first = PromptStream([{"prompt": f"s{k}"} for k in range(40)], seed=0).take(4)
    assert info["texts"] == [r["prompt"] for r in first for _ in range(G)]


def test_prompt_stream_shares_do_not_depend_on_process_count():
    # Process p's take(n) is rows [p*n, (p+1)*n) of the 1-process take(n * P), every
    # step: the global batch (process-major, as the sampler lays rows out) is the same.
    recs = [{"prompt": f"s{k}"} for k in range(10)]
    one = PromptStream(recs, seed=3)
    hosts = [PromptStream(recs, seed=3, process_index=p, process_count=2) for p in range(2)]
    for _ in range(4):  # crosses an epoch boundary (12 > 10 records by step 2)
        ref = [r["prompt"] for r in one.take(6)]
        got = [r["prompt"] for h in hosts for r in h.take(3)]
        assert got == ref
    assert hosts[0].get_state() == hosts[1].get_state() == one.get_state()


def test_prompt_stream_starts_no_threads_and_keeps_grains_order():
    # In-memory records are read synchronously: no prefetch threads (they outlived
    # every Trainer), and the same records and state as grain's default reader.
    import threading

    import grain

    recs = [{"prompt": f"s{k}"} for k in range(10)]
    before = {t.ident for t in threading.enumerate()}
    stream = PromptStream(recs, seed=5)
    got = [r["prompt"] for _ in range(5) for r in stream.take(5)]
    new = [t.name for t in threading.enumerate() if t.ident not in before]
    assert not new, new
    ref_it = iter(grain.MapDataset.source(recs).shuffle(seed=5).repeat().to_iter_dataset())
    assert got == [next(ref_it)["prompt"] for _ in range(25)]
    assert stream.get_state() == dict(ref_it.get_state()) == {"next_index": 25}


class RecordingSampler(FakeSampler):
    """FakeSampler that records each call's prompts, key and first row id."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, params, *, num_generations, key, chat_template, first_row=0):
        self.calls.append((list(prompts), jax.random.key_data(key).tolist(), first_row))
        return super().generate(
            prompts, params, num_generations=num_generations, key=key, chat_template=chat_template
        )


def test_sample_and_score_chunks_the_sampler_calls():
    from gdpo_jax.train.rollout import sample_and_score

    records = [{"prompt": f"s{k}"} for k in range(6)]
    kw = dict(
        runner=fake_runner,
        params=None,
        group_size=G,
        key=jax.random.key(3),
        max_prompt_len=5,
        pad_id=0,
    )
    one = RecordingSampler()
    whole = sample_and_score(records, sampler=one, **kw)
    assert len(one.calls) == 1 and whole["sample_calls"] == 1
    assert one.calls[0][1] == jax.random.key_data(jax.random.key(3)).tolist()  # key unchanged
    rec = RecordingSampler()
    out = sample_and_score(records, sampler=rec, prompts_per_call=2, **kw)
    assert [c[0] for c in rec.calls] == [["s0", "s1"], ["s2", "s3"], ["s4", "s5"]]
    # One key; each chunk's row ids continue the previous chunks' (Sampler.generate).
    assert len({str(c[1]) for c in rec.calls}) == 1
    assert [c[2] for c in rec.calls] == [0, 2 * G, 4 * G]
    assert out["sample_calls"] == 3
    # Rows stay grouped by prompt in input order: row r answers prompt r // G.
    np.testing.assert_array_equal(out["group_ids"], np.repeat(np.arange(6), G))
    assert out["texts"] == [f"s{k}" for k in range(6) for _ in range(G)]
    for k in ("rewards", "prompt_ids", "completion_mask"):
        np.testing.assert_array_equal(out[k], whole[k])
    # A last, shorter chunk is allowed.
    rec = RecordingSampler()
    out = sample_and_score(records[:5], sampler=rec, prompts_per_call=2, **kw)
    assert [len(c[0]) for c in rec.calls] == [2, 2, 1] and len(out["texts"]) == 5 * G


def _signal_reference(rewards: np.ndarray, decoupled: bool, weights=None) -> bool:
    """The former NumPy-only definition (float64), kept as an independent reference."""
    rewards = np.asarray(rewards, np.float64)
    if decoupled:
        return any(c[~np.isnan(c)].size >= 2 and np.ptp(c[~np.isnan(c)]) > 0 for c in rewards.T)
    w = np.ones(rewards.shape[1]) if weights is None else np.asarray(weights, np.float64)
    return bool(np.ptp(np.nan_to_num(rewards, nan=0.0) @ w) > 0)


def test_groups_with_signal_matches_numpy_reference():
    from gdpo_jax.train.rollout import groups_with_signal

    rng = np.random.default_rng(0)
    P, K = 64, 3
    r = rng.integers(0, 2, size=(P * G, K)).astype(np.float32)
    r[rng.random(r.shape) < 0.2] = np.nan
    r[: 2 * G] = 1.0  # constant groups
    for decoupled in (True, False):
        for w in (None, [1.0, 2.0, -1.0]):
            got = groups_with_signal(r, group_size=G, decoupled=decoupled, weights=w)
            want = [_signal_reference(r[g * G : (g + 1) * G], decoupled, w) for g in range(P)]
            np.testing.assert_array_equal(got, want)
            assert [
                group_has_signal(r[g * G : (g + 1) * G], decoupled=decoupled, weights=w)
                for g in range(P)
            ] == want


def test_groups_with_signal_is_core_per_reward_group_spread():
    """The host's NumPy spread equals core.per_reward_group_spread (its JAX form)
    on NaN, +/-inf, all-unscorable groups and float64 values that collide
    in float32."""
    from gdpo_jax.core.advantages import per_reward_group_spread
    from gdpo_jax.train.rollout import groups_with_signal

    rng = np.random.default_rng(1)
    g, p, k = 4, 48, 3
    r = rng.integers(0, 3, size=(p * g, k)).astype(np.float64)
    r[rng.random(r.shape) < 0.15] = np.nan
    r[rng.random(r.shape) < 0.1] = np.inf
    r[rng.random(r.shape) < 0.1] = -np.inf
    r[:g] = np.nan  # no scorable value at all
    r[g : 2 * g, 0] = [1.0, 1.0 + 1e-9, 1.0, 1.0 + 1e-9]  # distinct only in float64
    r[g : 2 * g, 1:] = 2.0
    r[2 * g : 3 * g] = [[np.inf, 0.0, 0.0], [5.0, 0.0, 0.0], [np.nan] * 3, [5.0, 0.0, 0.0]]
    ids = np.repeat(np.arange(p, dtype=np.int32), g)
    want = np.asarray(per_reward_group_spread(np.asarray(r, np.float32), ids, num_groups=p)).any(
        axis=1
    )
    got = groups_with_signal(r, group_size=g, decoupled=True)
    np.testing.assert_array_equal(got, want)
    assert not got[0] and not got[1] and not got[2]  # the hand-built groups
    assert want.sum() not in (0, p)  # both verdicts occur


def test_row_stats_give_the_mask_metrics_with_o_n_bytes():
    """Metrics gather per-row lengths across processes, not [N, C] masks."""
    from gdpo_jax.train.rollout import row_stats

    r = np.random.default_rng(0)
    n, c, p = 32, 50, 40
    lengths = r.integers(0, c + 1, n)
    arrays = {
        "rewards": r.normal(size=(n, 2)).astype(np.float32),
        "valid": r.random(n) > 0.2,
        "completion_mask": (np.arange(c)[None] < lengths[:, None]).astype(np.int32),
        "prompt_mask": (np.arange(p)[None] >= r.integers(0, p, n)[:, None]).astype(np.int32),
    }
    finish = ["length" if x == c else "eos" for x in lengths]
    stats = row_stats(arrays, finish)
    assert all(v.shape[0] == n and v.ndim <= 2 for v in stats.values())
    np.testing.assert_array_equal(stats["completion_len"], lengths)
    np.testing.assert_array_equal(stats["prompt_len"], arrays["prompt_mask"].sum(1))
    sent = sum(v.nbytes for v in stats.values())
    masks = arrays["completion_mask"].nbytes + arrays["prompt_mask"].nbytes
    assert sent * 10 < masks
    fin = ["length" if t else "eos" for t in stats["truncated"]]
    assert rollout_metrics(stats, fin, ["a", "b"], None) == rollout_metrics(
        arrays, finish, ["a", "b"], None
    )


class WidthSampler(FakeSampler):
    """Prompt "s<k>" has k % 7 + 1 tokens, left padded to the chunk's widest."""

    def generate(self, prompts, params, *, num_generations, key, chat_template, first_row=0):
        ro = super().generate(
            prompts, params, num_generations=num_generations, key=key, chat_template=chat_template
        )
        lens = np.repeat([int(p[1:]) % 7 + 1 for p in prompts], num_generations)
        w = int(lens.max())
        ro.prompt_mask = (np.arange(w)[None] >= (w - lens)[:, None]).astype(np.int32)
        ro.prompt_ids = np.where(ro.prompt_mask > 0, 5, 0).astype(np.int32)
        return ro


def test_prompt_buckets_pad_to_the_widest_prompts_bucket():
    from gdpo_jax.sampling.sampler import default_prompt_buckets
    from gdpo_jax.train.rollout import prompt_width, sample_and_score

    assert default_prompt_buckets(2048) == (256, 512, 1024, 2048)
    assert default_prompt_buckets(128) == (16, 32, 64, 128) and default_prompt_buckets(8) == (8,)
    # The bound docs/sampling.md states: at most max(2n, the smallest width) for n tokens
    # (not max(2n, 16): 2048's smallest width is 256).
    for top in (8, 100, 128, 2048):
        widths = default_prompt_buckets(top)
        for n in range(1, top + 1):
            assert prompt_width(n, top) >= n
            assert prompt_width(n, top, widths) <= max(2 * n, widths[0]), (top, n)
    assert prompt_width(10, 2048, default_prompt_buckets(2048)) == 256
    assert prompt_width(3, 16, (2, 4, 16)) == 4 and prompt_width(3, 16) == 16
    kw = dict(
        sampler=WidthSampler(),
        runner=fake_runner,
        params=None,
        group_size=G,
        key=jax.random.key(0),
        max_prompt_len=16,
        pad_id=0,
    )
    recs = [{"prompt": f"s{k}"} for k in (0, 1, 2)]  # 1..3 tokens
    full = sample_and_score(recs, **kw)
    short = sample_and_score(recs, prompt_buckets=(2, 4, 16), prompts_per_call=1, **kw)
    assert full["prompt_ids"].shape[1] == 16 and short["prompt_ids"].shape[1] == 4
    for k in ("prompt_ids", "prompt_mask"):  # same tokens, less left padding
        np.testing.assert_array_equal(full[k][:, -4:], short[k])
        assert not full[k][:, :-4].any()
    # Dynamic sampling joins tries of different widths at the widest one.
    stream = PromptStream([{"prompt": f"s{k}"} for k in range(40)], seed=0)
    kw.update(group_size=G, key=jax.random.key(0))
    arrays, info = collect_batch(
        stream, num_prompts=4, dynamic=True, max_tries=4, prompt_buckets=(2, 4, 8, 16), **kw
    )
    m = arrays["prompt_mask"]
    assert info["tries"] > 1 and m.shape[1] in (2, 4, 8)  # 7 tokens at most -> never 16
    assert m.shape[1] >= prompt_width(int(m.sum(1).max()), 16, (2, 4, 8, 16))
    np.testing.assert_array_equal(arrays["prompt_ids"] > 0, m > 0)


class SlowSampler(FakeSampler):
    def generate(self, prompts, params, **kw):
        time.sleep(0.15)
        return super().generate(prompts, params, **kw)


def slow_runner(prompts, completions, examples, **kw):
    time.sleep(0.02 * len(completions))
    return fake_runner(prompts, completions, examples, **kw)


def test_rewards_overlap_with_the_next_chunk_and_equal_sequential_scoring():
    from gdpo_jax.train.rollout import sample_and_score

    records = [{"prompt": f"s{k}"} for k in range(6)]
    kw = dict(
        sampler=SlowSampler(),
        runner=slow_runner,
        params=None,
        group_size=G,
        key=jax.random.key(0),
        max_prompt_len=5,
        pad_id=0,
        prompts_per_call=2,
    )
    seq = sample_and_score(records, overlap_rewards=False, **kw)
    ovl = sample_and_score(records, overlap_rewards=True, **kw)
    for k in ("rewards", "prompt_ids", "completion_ids", "old_logp", "group_ids"):
        np.testing.assert_array_equal(seq[k], ovl[k], err_msg=k)
    assert seq["texts"] == ovl["texts"] and ovl["sample_calls"] == 3
    # Sequential: all 12 rows scored after the last chunk (~0.24 s waited).
    # Overlapped: chunks 1-2 are scored during later decodes; only the last
    # chunk's 4 rows (~0.08 s) are waited for.
    assert seq["reward_wait_s"] >= 0.9 * seq["reward_s"] >= 0.2
    assert ovl["reward_s"] >= 0.2 and ovl["reward_wait_s"] < 0.6 * ovl["reward_s"]


def test_reward_errors_in_the_background_reach_the_caller():
    from gdpo_jax.train.rollout import sample_and_score

    def bad_runner(prompts, completions, examples, **kw):
        raise RuntimeError("reward exploded")

    with pytest.raises(RuntimeError, match="reward exploded"):
        sample_and_score(
            [{"prompt": f"s{k}"} for k in range(4)],
            sampler=FakeSampler(),
            runner=bad_runner,
            params=None,
            group_size=G,
            key=jax.random.key(0),
            max_prompt_len=5,
            pad_id=0,
            prompts_per_call=2,
            overlap_rewards=True,
        )


def test_grpo_signal_is_core_advantages_nonzero_and_gdpo_ignores_zero_weight_columns():
    """GRPO: a group has signal exactly when core.compute_advantages gives it a nonzero
    advantage (inf counts as 0 there, and sums are float32: the host's float64 sum with
    inf as 1.8e308 kept groups whose advantages are all 0). GDPO: a spread only in a
    column of weight 0 is no signal (its advantage is 0)."""
    import jax.numpy as jnp

    from gdpo_jax.core.advantages import compute_advantages
    from gdpo_jax.train.rollout import groups_with_signal, rollout_metrics

    g = 2
    r = np.array(
        [
            [np.inf, 1.0], [0.0, 1.0],  # inf as 0: both rows sum to 1
            [1e8, 1.0], [1e8, 0.0],  # 1e8 + 1 == 1e8 in float32
            [1.0, 0.0], [0.0, 0.0],  # a real spread
            [np.nan, 2.0], [0.0, 2.0],  # NaN as 0
        ],
        np.float64,
    )  # fmt: skip
    ids = np.repeat(np.arange(4), g).astype(np.int32)
    adv = compute_advantages(
        jnp.asarray(r, jnp.float32), jnp.asarray(ids), num_groups=4, estimator="grpo"
    )
    want = np.abs(np.asarray(adv).reshape(4, g)).max(axis=1) > 0
    np.testing.assert_array_equal(want, [False, False, True, False])  # the hand-worked verdicts
    np.testing.assert_array_equal(groups_with_signal(r, group_size=g, decoupled=False), want)

    gd = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]], np.float32)
    kept = groups_with_signal(gd, group_size=g, decoupled=True, weights=[1.0, 0.0])
    np.testing.assert_array_equal(kept, [False, True])
    adv = compute_advantages(
        jnp.asarray(gd), jnp.asarray([0, 0, 1, 1], jnp.int32), num_groups=2,
        estimator="gdpo_no_bn", weights=jnp.asarray([1.0, 0.0]),
    )  # fmt: skip
    assert np.all(np.asarray(adv)[:2] == 0) and np.any(np.asarray(adv)[2:] != 0)
    np.testing.assert_array_equal(
        groups_with_signal(gd, group_size=g, decoupled=True), [True, True]
    )  # unweighted: every column counts

    m = rollout_metrics(
        {"rewards": r.astype(np.float32), "valid": np.ones(8, bool), "completion_len": np.ones(8)},
        ["length"] * 8,
        ["a", "b"],
        None,
    )
    assert np.isfinite(m["reward/a/mean"]) and m["reward/a/nan_frac"] == 2 / 8
    assert np.isfinite(m["reward/total"])


def test_gdpo_signal_follows_nan_rewards_as_the_advantages_do():
    """A group [1, NaN] has one scorable row under the default (no advantage, no signal)
    and the spread 1 vs 0 under nan_rewards="zero" (an advantage, so dynamic sampling
    keeps it), as core.compute_advantages says."""
    import jax.numpy as jnp

    from gdpo_jax.core.advantages import compute_advantages
    from gdpo_jax.train.rollout import groups_with_signal

    r = np.array([[1.0], [np.nan], [2.0], [2.0]], np.float32)
    ids = jnp.asarray([0, 0, 1, 1], jnp.int32)
    for policy, want in (("omit", [False, False]), ("zero", [True, False])):
        adv = compute_advantages(
            jnp.asarray(r), ids, num_groups=2, estimator="gdpo_no_bn", nan_rewards=policy
        )
        has = np.abs(np.asarray(adv).reshape(2, 2)).max(axis=1) > 0
        np.testing.assert_array_equal(has, want)
        got = groups_with_signal(r, group_size=2, decoupled=True, nan_rewards=policy)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_scoring_failure_on_one_process_stops_every_process(monkeypatch, overlap):
    """With several processes, a reward that raised on one of them (rewards.on_error=
    "raise") stopped that process alone: the others went on into the next collective
    and waited for ever. The processes now agree after scoring: the failing one raises
    its own error, the others a RewardError naming another process."""
    from gdpo_jax.rewards.runner import RewardError
    from gdpo_jax.train import sample_score

    gathered: list[bool] = []

    def fake_any_process(flag: bool, other_failed: bool) -> bool:
        gathered.append(bool(flag))
        return bool(flag) or other_failed

    def failing_runner(prompts, completions, examples, **kw):
        raise RewardError("boom in a reward", reward="r")

    kw = dict(
        sampler=FakeSampler(),
        params=None,
        group_size=2,
        key=jax.random.key(0),
        max_prompt_len=5,
        pad_id=0,
        overlap_rewards=overlap,
        prompts_per_call=1,
        first_row=0,
    )
    recs = [{"prompt": "s0"}, {"prompt": "s1"}]
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    # This process scored fine, another failed: this one stops too.
    monkeypatch.setattr(sample_score, "any_process", lambda f: fake_any_process(f, True))
    with pytest.raises(RewardError, match="failed on another process"):
        sample_score.sample_and_score(recs, runner=fake_runner, **kw)
    # This one failed: its own error, after telling the others.
    with pytest.raises(RewardError, match="boom in a reward"):
        sample_score.sample_and_score(recs, runner=failing_runner, **kw)
    assert gathered == [False, True]
    # A prompt wider than max_prompt_len here (3 tokens, limit 2): raised on this process
    # alone, the others waited in a gather; it is agreed on as a scoring failure is.
    with pytest.raises(ValueError, match="exceeds sampling.max_prompt_len=2"):
        sample_score.sample_and_score(recs, runner=fake_runner, **(kw | {"max_prompt_len": 2}))
    assert gathered == [False, True, True]
    # Every process scored fine: no error.
    monkeypatch.setattr(sample_score, "any_process", lambda f: fake_any_process(f, False))
    out = sample_score.sample_and_score(recs, runner=fake_runner, **kw)
    assert out["rewards"].shape[0] == 4


def test_held_out_scoring_splits_the_records_over_the_processes(monkeypatch):
    """rollout.score_shared (the RL and the SFT held-out evals): each of 2 processes
    samples its contiguous share of 3 records (the second padded with a repeat), and
    the gathered rows are one process's, in record order. SFT's eval had every process
    sample every record: P times the work, and rows numbered past process 0's."""
    from gdpo_jax.train import distributed, rollout, sample_score
    from gdpo_jax.train.sample_score import sample_and_score

    part = [{"prompt": f"s{k}"} for k in (1, 2, 3)]
    kw = dict(runner=fake_runner, params=None, key=jax.random.key(0), max_prompt_len=5, pad_id=0)

    class Spy(FakeSampler):
        def __init__(self):
            self.seen = []

        def generate(self, prompts, params, **k):
            self.seen.append(list(prompts))
            return super().generate(prompts, params, **k)

    shares = {0: part[:2], 1: [part[2], part[2]]}
    outs = {
        p: sample_and_score(r, sampler=FakeSampler(), group_size=G, **kw) for p, r in shares.items()
    }
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(sample_score, "any_process", lambda flag: flag)  # none failed
    for pi in (0, 1):
        monkeypatch.setattr(jax, "process_index", lambda pi=pi: pi)

        def gather_host(x, pi=pi):
            key = "rewards" if np.asarray(x).ndim == 2 else "completion_mask"
            mine = outs[pi][key] if key == "rewards" else outs[pi][key].sum(1)
            np.testing.assert_array_equal(x, mine)  # this process brings its own share
            return np.stack([o[key] if key == "rewards" else o[key].sum(1) for o in outs.values()])

        monkeypatch.setattr(distributed, "allgather_host", gather_host)
        monkeypatch.setattr(
            distributed, "allgather_strings", lambda t: [o["texts"] for o in outs.values()]
        )
        spy = Spy()
        got = rollout.score_shared(part, G, sampler=spy, **kw)
        assert spy.seen == [[r["prompt"] for r in shares[pi]]]
        assert got["texts"] == [r["prompt"] for r in part for _ in range(G)]
        whole = sample_and_score(part, sampler=FakeSampler(), group_size=G, **kw)
        np.testing.assert_array_equal(got["rewards"], whole["rewards"])
        np.testing.assert_array_equal(got["lengths"], whole["completion_mask"].sum(1))


def test_the_logged_overlap_is_the_reduced_reward_time_less_the_reduced_wait():
    # With several processes the times are the slowest host's, and the overlap was
    # process 0's own: 0.4 s beside reward_s 1.0 and wait 0.9, so the logged
    # reward_s = reward_wait_s + reward_overlap_s did not hold.
    from gdpo_jax.train.distributed import combine_rows
    from gdpo_jax.train.rollout import host_metrics

    def info(reward_s, wait_s, failures):
        return {
            "sample_s": 2.0,
            "reward_s": reward_s,
            "reward_wait_s": wait_s,
            "reward_info": {"reward_failures/r": failures, "reward_time/r": reward_s, "x": 9.0},
        }

    other = host_metrics(info(1.0, 0.9, 2.0))  # process 1's own values

    def reduce(host):  # as `reduce_processes` over the two processes
        keys = sorted(host)
        table = np.asarray([[host[k] for k in keys], [other[k] for k in keys]])
        return combine_rows(table, keys, max_prefixes=("time/", "reward_time/"))

    one = host_metrics(info(0.5, 0.1, 1.0))
    assert one["time/reward_overlap_s"] == pytest.approx(0.4) and "x" not in one
    both = host_metrics(info(0.5, 0.1, 1.0), reduce)
    assert both["time/reward_s"] == 1.0 and both["time/reward_wait_s"] == 0.9
    assert both["time/reward_overlap_s"] == pytest.approx(1.0 - 0.9)
    assert both["reward_failures/r"] == 3.0 and both["time/sample_s"] == 2.0
