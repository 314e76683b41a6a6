"""The fused step against an unfused reference; sharded == unsharded; compiles once.

The reference computes advantages with NumPy loops (GDPO / GRPO as in the
official TRL patch), log-probs from the model's ordinary full-logits forward
with a plain log-softmax, and the clipped surrogate written out by hand. The
step's gradient is read back through SGD with learning rate 1 (new = old - g).
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from gdpo_jax.models import ModelConfig
from gdpo_jax.models.sharding import create_model
from gdpo_jax.train import distributed
from gdpo_jax.train import state as state_lib
from gdpo_jax.train.step import CompiledStep, StepConfig
from tests.test_diagnostics import np_shares

CFG = ModelConfig.tiny(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
)
NUM_GROUPS, G, P, C, K = 4, 4, 5, 6, 2
N = NUM_GROUPS * G
EPS = 1e-4


def make_batch(seed: int = 0, *, with_ref: bool = False) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    prompt_mask = np.ones((N, P), np.int32)
    for i in range(N):
        prompt_mask[i, : r.integers(0, 3)] = 0  # left padding
    lengths = r.integers(1, C + 1, N)
    completion_mask = (np.arange(C)[None] < lengths[:, None]).astype(np.int32)
    b = {
        "prompt_ids": np.where(prompt_mask, r.integers(3, 64, (N, P)), 0).astype(np.int32),
        "prompt_mask": prompt_mask,
        "completion_ids": np.where(completion_mask, r.integers(3, 64, (N, C)), 0).astype(np.int32),
        "completion_mask": completion_mask,
        # Behaviour log-probs near the policy's (~ -log 64) so some ratios clip.
        "old_logp": (np.log(1 / 64) + r.normal(0, 0.3, (N, C))).astype(np.float32),
        "rewards": np.stack([r.integers(0, 2, N), r.normal(0, 1, N)], 1).astype(np.float32),
        "group_ids": np.repeat(np.arange(NUM_GROUPS), G).astype(np.int32),
        "valid": np.ones(N, bool),
    }
    b["rewards"][:G, 0] = 1.0  # a group with no spread in reward 0
    if with_ref:
        b["ref_logp"] = (np.log(1 / 64) + r.normal(0, 0.3, (N, C))).astype(np.float32)
    return b


# ------------------------------------------------------------------ references
def np_advantages(
    rewards: np.ndarray,
    gids: np.ndarray,
    estimator: str,
    weights: np.ndarray,
    penalty: np.ndarray | float = 0.0,
) -> np.ndarray:
    """penalty: per-row KL-in-reward term; GRPO sums it into the reward, GDPO adds
    it to the sum of normalized rewards before the batch whitening."""
    n, k = rewards.shape
    adv = np.zeros(n)
    if estimator == "grpo":
        s = (rewards * weights).sum(1) + penalty
        for g in np.unique(gids):
            idx = np.where(gids == g)[0]
            adv[idx] = (s[idx] - s[idx].mean()) / (s[idx].std(ddof=1) + EPS)
        return adv
    total = np.zeros(n)
    for j in range(k):
        for g in np.unique(gids):
            idx = np.where(gids == g)[0]
            x = rewards[idx, j].astype(np.float64)
            total[idx] += weights[j] * (x - x.mean()) / (x.std(ddof=1) + EPS)
    total = total + penalty
    return (total - total.mean()) / (total.std(ddof=1) + EPS)


def reference_loss(params, graphdef, batch, adv, sc: StepConfig):
    """Unfused: full logits -> log_softmax -> clipped surrogate, row means (grpo agg)."""
    model = nnx.merge(graphdef, params)
    ids = jnp.concatenate([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = jnp.concatenate([batch["prompt_mask"], batch["completion_mask"]], 1)
    logits = model(ids, mask)[:, P - 1 : -1] / sc.temperature
    logsm = jax.nn.log_softmax(logits, -1)
    logp = jnp.take_along_axis(logsm, batch["completion_ids"][..., None], -1)[..., 0]
    ent = -jnp.sum(jnp.exp(logsm) * logsm, -1)
    m = batch["completion_mask"].astype(jnp.float32)
    ratio = jnp.exp(logp - batch["old_logp"])
    a = adv[:, None]
    per_tok = -jnp.minimum(ratio * a, jnp.clip(ratio, 1 - sc.clip_low, 1 + sc.clip_high) * a)
    if sc.dual_clip:
        per_tok = jnp.where(a < 0, jnp.minimum(per_tok, -a * sc.dual_clip), per_tok)
    if sc.beta:
        d = batch["ref_logp"] - logp
        per_tok = per_tok + sc.beta * (jnp.exp(d) - d - 1)  # k3
    per_tok = per_tok - sc.entropy_coef * ent
    if "valid" in batch:
        m = m * batch["valid"][:, None]
    if sc.aggregation == "grpo":
        return jnp.mean(jnp.sum(per_tok * m, 1) / jnp.sum(m, 1))
    if sc.aggregation == "dr_grpo":  # Dr. GRPO: valid rows x max_len
        return jnp.sum(per_tok * m) / (jnp.sum(batch["valid"]) * sc.max_len)
    return jnp.sum(per_tok * m) / jnp.sum(m)  # dapo; bnpo of one micro-batch


def _sgd_step(sc: StepConfig, model, mesh=None):
    tx = optax.sgd(1.0)
    graphdef, state = state_lib.create_train_state(model, tx, mesh)
    step = CompiledStep(
        graphdef=graphdef,
        tx=tx,
        schedule=optax.constant_schedule(1.0),
        cfg=sc,
        state_shardings=state_lib.shardings_of(state),
        mesh=mesh,
    )
    return graphdef, state, step


def np_sequence_kl(old: np.ndarray, ref: np.ndarray, mask: np.ndarray, est: str) -> np.ndarray:
    """The KL-in-reward per row: the estimator's per-token values summed over the mask."""
    d = old.astype(np.float64) - ref
    tok = {"k1": d, "k3": np.exp(-d) + d - 1.0, "mse": 0.5 * d * d}[est]
    return (tok * mask).sum(1)


@pytest.mark.parametrize(
    "estimator,aggregation,beta,entropy_coef,dual_clip,kl_in_reward,kl_est",
    [
        ("gdpo", "grpo", 0.05, 0.01, None, 0.0, "k1"),
        # bnpo with one micro-batch is dapo's formula (the reference's); its
        # per-micro-batch form: test_bnpo_per_micro_batch_and_dr_grpo_without_padding_rows
        # dual clip 1.5: this batch's ratios reach 2.3, so it bites on 11 % of tokens
        ("grpo", "bnpo", 0.0, 0.0, 1.5, 0.1, "k1"),
        ("gdpo", "dapo", 0.0, 0.0, None, 0.05, "k1"),
        # algo.kl_in_reward_estimator: the penalty was always k1
        ("gdpo", "dapo", 0.0, 0.0, None, 0.5, "k3"),
        ("grpo", "grpo", 0.0, 0.0, None, 0.5, "mse"),
    ],
)
def test_step_equals_unfused_reference(
    estimator, aggregation, beta, entropy_coef, dual_clip, kl_in_reward, kl_est
):
    sc = StepConfig(
        num_groups=NUM_GROUPS,
        estimator=estimator,
        weights=(1.0, 0.5),
        eps=EPS,
        beta=beta,
        entropy_coef=entropy_coef,
        dual_clip=dual_clip,
        aggregation=aggregation,
        temperature=0.7,
        clip_low=0.1,
        clip_high=0.15,
        kl_in_reward=kl_in_reward,
        kl_in_reward_estimator=kl_est,
    )
    model = create_model(CFG, seed=1)
    graphdef, state, step = _sgd_step(sc, model)
    params0 = jax.tree.map(np.asarray, state.params)
    batch = make_batch(1, with_ref=sc.needs_ref)
    penalty = 0.0
    if kl_in_reward:
        # KL in the reward: -coef * sum_t kl(old, ref) per row.
        seq_kl = np_sequence_kl(
            batch["old_logp"], batch["ref_logp"], batch["completion_mask"], kl_est
        )
        penalty = -kl_in_reward * seq_kl
    adv = np_advantages(
        batch["rewards"], batch["group_ids"], estimator, np.array([1.0, 0.5]), penalty
    )
    ref_l, ref_g = jax.value_and_grad(reference_loss)(
        jax.tree.map(jnp.asarray, params0),
        graphdef,
        jax.tree.map(jnp.asarray, batch),
        jnp.asarray(adv, jnp.float32),
        sc,
    )
    new_state, metrics = step(state, distributed.to_global(batch, None))
    np.testing.assert_allclose(float(metrics["loss"]), float(ref_l), rtol=1e-5, atol=1e-6)
    got_g = jax.tree.map(lambda a, b: a - np.asarray(b), params0, new_state.params)
    for (path, g_ref), g in zip(jax.tree_util.tree_leaves_with_path(ref_g), jax.tree.leaves(got_g)):
        np.testing.assert_allclose(
            g, np.asarray(g_ref), rtol=2e-4, atol=2e-6, err_msg=jax.tree_util.keystr(path)
        )
    assert (
        float(jnp.abs(ref_l)) > 0
        and max(float(jnp.abs(x).max()) for x in jax.tree.leaves(ref_g)) > 1e-4
    )
    # Advantage statistics come from the same advantages as the NumPy loops.
    np.testing.assert_allclose(float(metrics["adv/mean"]), adv.mean(), atol=1e-5)
    np.testing.assert_allclose(float(metrics["adv/std"]), adv.std(), rtol=1e-4, atol=1e-5)
    # The share diagnostic, logged per reward column from the step's own advantages.
    want = np_shares(batch["rewards"], adv, batch["group_ids"], batch["valid"])
    for k in range(batch["rewards"].shape[1]):
        np.testing.assert_allclose(float(metrics[f"adv/share/{k}"]), want[k], atol=1e-4)
    assert int(new_state.step) == 1
    if kl_in_reward:  # the logged penalty: the mean row KL over valid rows
        ok = batch["valid"] > 0
        np.testing.assert_allclose(float(metrics["kl_in_reward"]), seq_kl[ok].mean(), rtol=1e-5)
    if dual_clip:  # the case reaches the dual clip's branch, or it checks nothing
        assert float(metrics["clip_frac_dual"]) > 0.05


def _f32_shapes(hlo: str) -> set[tuple[int, ...]]:
    """The f32 array shapes of rank >= 3 in a lowered program's text."""
    found = re.findall(r"tensor<((?:\d+x){2,}\d+)xf32>", hlo)
    return {tuple(int(d) for d in m.split("x")) for m in found}


def test_grad_accumulation_equals_big_batch():
    """4 micro-batches accumulated == 1 big batch (grpo and dapo aggregations).

    The accumulated run also uses the chunked log-softmax (chunk 4 of C=6),
    so it checks chunked == full-vocab log-probs/entropies as well: its lowered
    step holds [N/4, 4, V] logits blocks and no [., C, V] array, where the other
    holds the full [N, C, V]."""
    batch = make_batch(2)
    for agg in ("grpo", "dapo"):
        outs = []
        for micro in (1, 4):
            sc = StepConfig(
                num_groups=NUM_GROUPS,
                aggregation=agg,
                num_microbatches=micro,
                logprob_chunk_size=4 if micro > 1 else 0,
            )
            _, state, step = _sgd_step(sc, create_model(CFG, seed=0))
            gbatch = distributed.to_global(batch, None)
            shapes = _f32_shapes(step.lower(state, gbatch).as_text())
            V = CFG.vocab_size
            if micro == 1:
                assert (N, C, V) in shapes
            else:  # the micro-batches' rows in chunks of 4 positions, never all C at once
                assert (N // micro, 4, V) in shapes
                assert not [s for s in shapes if s[-2:] == (C, V)], shapes
            new_state, metrics = step(state, gbatch)
            outs.append((jax.tree.map(np.asarray, new_state.params), metrics))
        (p1, m1), (p4, m4) = outs
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), p1, p4)
        for k in ("loss", "clip_frac", "entropy", "ratio_max", "ratio_min", "approx_kl"):
            np.testing.assert_allclose(
                float(m1[k]), float(m4[k]), rtol=1e-5, atol=1e-7, err_msg=f"{agg}: {k}"
            )


def test_minibatches_are_sequential_updates():
    """2 PPO mini-batches == 2 SGD updates by hand, on rows 0::2 then rows 1::2,
    both with the advantages of the whole batch."""
    batch = make_batch(3)
    sc = StepConfig(num_groups=NUM_GROUPS, num_minibatches=2)
    graphdef, state, step = _sgd_step(sc, create_model(CFG, seed=0))
    params = jax.tree.map(jnp.asarray, jax.tree.map(np.asarray, state.params))
    got, metrics = step(state, distributed.to_global(batch, None))
    adv = np_advantages(batch["rewards"], batch["group_ids"], "gdpo", np.ones(K))
    for half in (0, 1):
        sub = {k: jnp.asarray(v[half::2]) for k, v in batch.items()}
        g = jax.grad(reference_loss)(
            params, graphdef, sub, jnp.asarray(adv[half::2], jnp.float32), sc
        )
        params = jax.tree.map(lambda p, d: p - d, params, g)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6),
        got.params,
        params,
    )
    # The second update sees a moved policy: ratios leave 1 (they start at
    # exp(logp - old_logp) of the data, so compare to the first update instead).
    assert int(got.step) == 1


@pytest.mark.parametrize("aggregation,micro", [("bnpo", 2), ("dr_grpo", 2)])
def test_bnpo_per_micro_batch_and_dr_grpo_without_padding_rows(aggregation, micro):
    """bnpo = mean over micro-batches of each one's token mean (TRL); dr_grpo's
    denominator counts valid rows only. The last group is batch padding."""
    batch = make_batch(4)
    batch["valid"][-G:] = False
    sc = StepConfig(
        num_groups=NUM_GROUPS, aggregation=aggregation, num_microbatches=micro, max_len=C + 2
    )
    graphdef, state, step = _sgd_step(sc, create_model(CFG, seed=0))
    params0 = jax.tree.map(jnp.asarray, jax.tree.map(np.asarray, state.params))
    keep = batch["valid"]
    adv = np.zeros(N)
    adv[keep] = np_advantages(batch["rewards"][keep], batch["group_ids"][keep], "gdpo", np.ones(K))
    jb = jax.tree.map(jnp.asarray, batch)
    ja = jnp.asarray(adv, jnp.float32)

    def ref(params):
        if aggregation == "dr_grpo":
            return reference_loss(params, graphdef, jb, ja, sc)
        # micro-batch j takes rows j::micro (the step's layout)
        parts = [
            reference_loss(
                params, graphdef, {k: v[j::micro] for k, v in jb.items()}, ja[j::micro], sc
            )
            for j in range(micro)
        ]
        return sum(parts) / micro

    ref_l, ref_g = jax.value_and_grad(ref)(params0)
    new_state, metrics = step(state, distributed.to_global(batch, None))
    np.testing.assert_allclose(float(metrics["loss"]), float(ref_l), rtol=1e-5, atol=1e-6)
    got_g = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), params0, new_state.params)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, np.asarray(b), rtol=2e-4, atol=2e-6),
        got_g,
        ref_g,
    )
    # Not the same as the token mean over the whole batch (dapo) / all rows.
    if aggregation == "bnpo":
        whole = reference_loss(params0, graphdef, jb, ja, sc)
    else:
        whole = reference_loss(params0, graphdef, jb, ja, sc) * jnp.sum(jb["valid"]) / N
    assert abs(float(whole) - float(ref_l)) > 1e-4 * abs(float(ref_l))


def _assert_same_update(two_pass: tuple, fused: tuple) -> dict:
    """(params, metrics) of a two-program step and of its fused form: the same
    params and every metric (f32, rtol 1e-6). Returns the fused form's metrics."""
    (p2, m2), (p1, m1) = two_pass, fused
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), p2, p1)
    assert set(m1) == set(m2)
    for k in m1:
        np.testing.assert_allclose(float(m1[k]), float(m2[k]), rtol=1e-6, atol=1e-7, err_msg=k)
    return m1


@pytest.mark.parametrize("micro,beta", [(1, 0.0), (2, 0.04)])
def test_old_logp_in_step_equals_two_pass_recompute(micro, beta):
    """One update per batch: old = stop_gradient(logp) in the step (one forward)
    gives the same params and metrics as a separate pre-update log-prob pass."""
    batch = make_batch(5, with_ref=beta > 0)
    outs = []
    for fused in (False, True):
        sc = StepConfig(
            num_groups=NUM_GROUPS,
            num_microbatches=micro,
            beta=beta,
            entropy_coef=0.01,
            old_logp_in_step=fused,
        )
        _, state, step = _sgd_step(sc, create_model(CFG, seed=2))
        b = distributed.to_global(batch, None)
        if fused:
            assert "old_logp" not in step.batch_keys
            b["old_logp"] = jnp.full_like(b["old_logp"], 123.0)  # ignored
        else:
            b["old_logp"] = step.logprobs(state.params, b)  # the separate pass
        new_state, metrics = step(state, b)
        outs.append((jax.tree.map(np.asarray, new_state.params), metrics))
    m1 = _assert_same_update(*outs)
    assert float(m1["ratio_max"]) == 1.0 and float(m1["clip_frac"]) == 0.0


def test_old_logp_in_step_only_when_one_update_and_no_kl_in_reward():
    from gdpo_jax.train.step import old_logp_in_step

    assert old_logp_in_step("recompute", updates_per_step=1, kl_in_reward=0.0)
    assert not old_logp_in_step("sampler", updates_per_step=1, kl_in_reward=0.0)
    assert not old_logp_in_step("recompute", updates_per_step=2, kl_in_reward=0.0)
    assert not old_logp_in_step("recompute", updates_per_step=1, kl_in_reward=0.01)
    sc = StepConfig(num_groups=NUM_GROUPS, num_minibatches=2, old_logp_in_step=True)
    with pytest.raises(ValueError, match="updates_per_step == 1"):
        _sgd_step(sc, create_model(CFG, seed=0))


@pytest.mark.parametrize("micro,scan_layers", [(1, True), (2, False)])
def test_ref_logp_in_step_equals_separate_reference_pass(micro, scan_layers):
    """One update per batch: the reference forward inside the step's micro-batch
    loop gives the same params and metrics as a separate reference pass whose
    output the batch carries; the reference differs from the policy (KL > 0)."""
    cfg = dataclasses.replace(CFG, scan_layers=scan_layers)
    batch = make_batch(6)
    ref_params = nnx.state(create_model(cfg, seed=3), nnx.Param)
    outs = []
    for fused in (False, True):
        sc = StepConfig(
            num_groups=NUM_GROUPS,
            num_microbatches=micro,
            beta=0.04,
            old_logp_in_step=True,
            ref_logp_in_step=fused,
        )
        _, state, step = _sgd_step(sc, create_model(cfg, seed=2))
        b = distributed.to_global(batch, None)
        if fused:
            assert "ref_logp" not in step.batch_keys
            b["ref_logp"] = jnp.full_like(b["completion_mask"], 7, jnp.float32)  # ignored
        else:
            b["ref_logp"] = step.logprobs(ref_params, b)  # the separate pass
        new_state, metrics = step(state, b, ref_params)
        outs.append((jax.tree.map(np.asarray, new_state.params), metrics))
    m1 = _assert_same_update(*outs)
    assert float(m1["kl"]) > 1e-3  # the reference is another model


def test_ref_logp_in_step_only_when_one_update_and_no_kl_in_reward():
    from gdpo_jax.train.step import ref_logp_in_step

    assert ref_logp_in_step(0.04, updates_per_step=1, kl_in_reward=0.0)
    assert not ref_logp_in_step(0.0, updates_per_step=1, kl_in_reward=0.0)
    assert not ref_logp_in_step(0.04, updates_per_step=2, kl_in_reward=0.0)
    assert not ref_logp_in_step(0.04, updates_per_step=1, kl_in_reward=0.01)
    model = create_model(CFG, seed=0)
    sc = StepConfig(num_groups=NUM_GROUPS, beta=0.04, num_epochs=2, ref_logp_in_step=True)
    with pytest.raises(ValueError, match="updates_per_step == 1"):
        _sgd_step(sc, model)
    sc = StepConfig(num_groups=NUM_GROUPS, beta=0.04, ref_logp_in_step=True)
    _, state, step = _sgd_step(sc, model)
    with pytest.raises(ValueError, match="pass the reference params"):
        step(state, distributed.to_global(make_batch(0), None))


def test_step_compiles_once_per_prompt_bucket_and_padding_changes_nothing():
    """A wider prompt bucket (more left padding) gives the same update; the step
    compiles once per width, not once per call."""
    batch = make_batch(6)
    wide = dict(batch)
    for k in ("prompt_ids", "prompt_mask"):
        wide[k] = np.pad(batch[k], ((0, 0), (3, 0)))  # P = 5 -> bucket 8
    sc = StepConfig(num_groups=NUM_GROUPS, num_microbatches=2)
    outs = []
    _, state0, step = _sgd_step(sc, create_model(CFG, seed=3))
    params0 = jax.tree.map(np.asarray, state0.params)
    for b in (batch, wide, batch, wide):
        _, state, _ = _sgd_step(sc, create_model(CFG, seed=3))
        new_state, metrics = step(state, distributed.to_global(b, None))
        outs.append((jax.tree.map(np.asarray, new_state.params), metrics))
    assert step.compile_count() == 2
    (p5, m5), (p8, m8) = outs[:2]
    assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, p5, params0)))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), p5, p8)
    for k in m5:
        np.testing.assert_allclose(float(m5[k]), float(m8[k]), rtol=1e-6, atol=1e-7, err_msg=k)


def _adamw_step(sc: StepConfig, model, tx=None, schedule=None):
    """(state, CompiledStep) of `model` with `tx` / `schedule` (default AdamW, lr 1e-2)."""
    tx = tx or optax.adamw(1e-2, weight_decay=0.1)
    graphdef, state = state_lib.create_train_state(model, tx, None)
    step = CompiledStep(
        graphdef=graphdef,
        tx=tx,
        schedule=schedule or optax.constant_schedule(1e-2),
        cfg=sc,
        state_shardings=state_lib.shardings_of(state),
        mesh=None,
    )
    return state, step


def test_a_mini_batch_of_padding_groups_neither_updates_nor_pulls_the_ratio_metrics():
    """Dynamic sampling pads with invalid groups. With 2 mini-batches of 4 groups, the
    second holds groups 1 and 3: both invalid here, it has no token. It used to run
    AdamW anyway (weight decay and momentum moved the weights) and to report a ratio
    of 1.0 into ratio_min / ratio_max. Now the step equals one update over the valid
    groups, metrics included, and a batch with no valid group leaves the state as is."""
    batch = make_batch(6)
    batch["valid"][:] = True
    for g in (1, 3):
        batch["valid"][g * G : (g + 1) * G] = False
    outs = []
    for minibatches in (1, 2):
        sc = StepConfig(num_groups=NUM_GROUPS, num_minibatches=minibatches, group_size=G)
        assert sc.layout_units(N)[0] == G  # mini-batches of whole groups, as a run's
        state, step = _adamw_step(sc, create_model(CFG, seed=0))
        new_state, metrics = step(state, distributed.to_global(batch, None))
        outs.append((jax.tree.map(np.asarray, new_state.params), metrics, new_state))
    (p1, m1, s1), (p2, m2, s2) = outs
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), p1, p2)
    # loss and grad_norm too: the padding mini-batch's 0 loss and 0 norm halved them.
    for k in ("ratio_min", "ratio_max", "clip_frac", "entropy", "loss", "grad_norm"):
        np.testing.assert_allclose(float(m1[k]), float(m2[k]), rtol=1e-5, err_msg=k)
    assert float(m1["grad_norm"]) > 0
    assert float(m1["ratio_min"]) < 1.0 < float(m1["ratio_max"])  # real ratios, not 1
    # The skipped update leaves AdamW's state too (its step count included).
    counts = [int(np.asarray(s.opt_state[0].count)) for s in (s1, s2)]
    assert counts == [1, 1], counts

    batch["valid"][:] = False  # nothing to learn from: the state stays as it was
    state, step = _adamw_step(StepConfig(num_groups=NUM_GROUPS), create_model(CFG, seed=0))
    before = jax.tree.map(np.asarray, state.params)
    new_state, metrics = step(state, distributed.to_global(batch, None))
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, new_state.params))
    # No valid row: every metric is NaN (lr aside), as the rollout's reward means; the
    # adv/* metrics (shares, distinct values) were 0.0, averaged into plots and studies.
    assert {"adv/mean", "adv/distinct_per_group", "loss", "ratio_max"} <= set(metrics)
    assert any(k.startswith("adv/share/") for k in metrics)
    for k, v in metrics.items():
        assert np.isfinite(float(v)) == (k in ("lr", "nonfinite_updates")), (k, float(v))
    assert float(metrics["nonfinite_updates"]) == 0  # no update, so none refused


def test_a_skipped_mini_batch_still_advances_the_learning_rate_schedule():
    """A skipped update (a mini-batch of padding groups) restored the whole optimizer
    state, the schedule's count too: warmup and decay ran one update late for the rest
    of the run, and the logged lr (schedule(step * updates_per_step)) was not the one
    applied. The schedule counts every update; AdamW's own count (bias correction)
    only the ones made."""
    batch = make_batch(6)
    batch["valid"][:] = True
    for g in (1, 3):  # the second of 2 mini-batches: no token
        batch["valid"][g * G : (g + 1) * G] = False
    from gdpo_jax.train.schema import base_config

    optim = base_config().optim  # the schema's AdamW settings, a linear schedule here
    optim.update(lr=1e-2, schedule="linear", warmup_steps=2, min_lr_ratio=0.0)
    sc = StepConfig(num_groups=NUM_GROUPS, num_minibatches=2, group_size=G)
    tx, schedule = state_lib.make_optimizer(optim, total_updates=8, updates_per_step=2)
    state, step = _adamw_step(sc, create_model(CFG, seed=0), tx, schedule)
    state, _ = step(state, distributed.to_global(batch, None))
    is_sched = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
    is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)  # noqa: E731
    nodes = jax.tree.leaves(state.opt_state, is_leaf=lambda x: is_sched(x) or is_adam(x))
    (sched,) = [int(n.count) for n in nodes if is_sched(n)]
    (adam,) = [int(n.count) for n in nodes if is_adam(n)]
    assert (sched, adam) == (2, 1)  # both updates counted by the schedule, one made
    batch["valid"][:] = True
    state, metrics = step(state, distributed.to_global(batch, None))
    assert float(metrics["lr"]) == pytest.approx(float(schedule(2)))  # 0.005: warming up
    nodes = jax.tree.leaves(state.opt_state, is_leaf=lambda x: is_sched(x) or is_adam(x))
    assert [int(n.count) for n in nodes if is_sched(n)] == [4]


def test_sequence_kl_ignores_masked_positions_even_non_finite():
    """The KL-in-reward penalty sums k1 over the completion tokens only: an inf or NaN
    log-prob at a padding position must not make the row's penalty NaN (the advantages
    take a NaN penalty as none)."""
    from gdpo_jax.train.step import sequence_kl

    logp = np.array([[-1.0, -2.0, -np.inf], [-0.5, np.nan, 0.0]], np.float32)
    ref = np.array([[-1.5, -1.0, -3.0], [-0.25, -1.0, -1.0]], np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.int32)
    out = np.asarray(sequence_kl(logp, ref, mask))
    np.testing.assert_allclose(out, [(-1.0 + 1.5) + (-2.0 + 1.0), -0.5 + 0.25])


def test_nan_rewards_zero_is_the_official_patchs_nan_to_num():
    """algo.nan_rewards="zero": an unscorable reward counts as 0 in its group (the TRL
    patch's nan_to_num); the default leaves it out. The step's loss under "zero" is the
    reference's over the rewards with NaN as 0, and differs from the default's."""
    batch = make_batch(2)
    batch["rewards"][[1, 5, 6], 0] = np.nan
    losses = {}
    for policy in ("omit", "zero"):
        sc = StepConfig(num_groups=NUM_GROUPS, weights=(1.0, 0.5), eps=EPS, nan_rewards=policy)
        graphdef, state, step = _sgd_step(sc, create_model(CFG, seed=1))
        params0 = jax.tree.map(np.asarray, state.params)  # the step donates the state
        _, metrics = step(state, distributed.to_global(batch, None))
        losses[policy] = float(metrics["loss"])
    adv = np_advantages(
        np.nan_to_num(batch["rewards"]), batch["group_ids"], "gdpo", np.array([1.0, 0.5])
    )
    want = reference_loss(
        jax.tree.map(jnp.asarray, params0),
        graphdef,
        jax.tree.map(jnp.asarray, batch),
        jnp.asarray(adv, jnp.float32),
        sc,
    )
    np.testing.assert_allclose(losses["zero"], float(want), rtol=1e-5, atol=1e-6)
    assert abs(losses["zero"] - losses["omit"]) > 1e-4


def test_the_logged_share_reads_a_nan_reward_as_the_estimator_did():
    """GRPO sums an unscorable (NaN) reward as 0; the share diagnostic left it out of its
    centring, so it measured GRPO's advantage against rewards GRPO never read: with one
    reward, GRPO w/o std's advantage is that reward centred, share 1, and 0.9 was logged.
    (GRPO's shares were pulled down wherever a reward could be NaN, GDPO's were not.)"""
    batch = make_batch(3)
    batch["rewards"] = batch["rewards"][:, 1:].copy()  # one reward
    batch["rewards"][[1, 6, 9], 0] = np.nan
    sc = StepConfig(num_groups=NUM_GROUPS, estimator="grpo_no_std", reward_names=("r",))
    state, step = _adamw_step(sc, create_model(CFG, seed=0))
    _, metrics = step(state, distributed.to_global(batch, None))
    np.testing.assert_allclose(float(metrics["adv/share/r"]), 1.0, atol=1e-5)


@pytest.mark.parametrize("micro", [1, 2])
def test_bfloat16_parameters_train_with_adam(micro):
    # model.param_dtype="bfloat16" is a documented setting, but the step multiplied the bf16
    # gradients by an f32 scalar: Adam's moments came out f32 and the update scan refused
    # its own carry (TypeError) on the first step. The gradients are now summed in f32 and
    # handed to the optimizer in the parameters' dtype.
    out = {}
    for pdt in ("float32", "bfloat16"):
        cfg = dataclasses.replace(CFG, param_dtype=jnp.dtype(pdt), dtype=jnp.bfloat16)
        tx = optax.adam(1e-3)
        graphdef, state = state_lib.create_train_state(create_model(cfg, seed=0), tx, None)
        step = CompiledStep(
            graphdef=graphdef,
            tx=tx,
            schedule=optax.constant_schedule(1e-3),
            cfg=StepConfig(num_groups=NUM_GROUPS, num_microbatches=micro),
            state_shardings=state_lib.shardings_of(state),
            mesh=None,
        )
        new, metrics = step(state, distributed.to_global(make_batch(0), None))
        out[pdt] = metrics
        kinds = {x.dtype for x in jax.tree.leaves(new.opt_state) if x.ndim}
        assert {x.dtype for x in jax.tree.leaves(new.params)} == {jnp.dtype(pdt)}
        assert kinds == {jnp.dtype(pdt)}, kinds
    # Same compute dtype, same loss; the gradient's norm agrees to bf16's precision.
    np.testing.assert_allclose(float(out["bfloat16"]["loss"]), float(out["float32"]["loss"]), 1e-6)
    np.testing.assert_allclose(
        float(out["bfloat16"]["grad_norm"]), float(out["float32"]["grad_norm"]), rtol=1e-2
    )


def test_a_non_finite_update_is_not_applied_and_is_counted():
    # An overflowing update (here SGD whose step is scaled by inf: finite gradients, an
    # infinite step) was applied: every later step, sample and checkpoint was NaN.
    def one_step(scale):
        tx = optax.chain(optax.sgd(1.0), optax.scale(scale))
        graphdef, state = state_lib.create_train_state(create_model(CFG, seed=0), tx, None)
        before = [np.asarray(x) for x in jax.tree.leaves(state.params)]
        step = CompiledStep(
            graphdef=graphdef,
            tx=tx,
            schedule=optax.constant_schedule(1.0),
            cfg=StepConfig(num_groups=NUM_GROUPS),
            state_shardings=state_lib.shardings_of(state),
            mesh=None,
        )  # the step donates `state`: `before` is a host copy
        new, metrics = step(state, distributed.to_global(make_batch(0), None))
        after = jax.tree.leaves(new.params)
        return [np.array_equal(a, np.asarray(b)) for a, b in zip(before, after)], metrics

    same, metrics = one_step(1.0)
    assert not all(same) and float(metrics["nonfinite_updates"]) == 0
    same, metrics = one_step(float("inf"))
    assert float(metrics["nonfinite_updates"]) == 1
    assert np.isfinite(float(metrics["grad_norm"]))  # the gradient was fine, the step not
    assert all(same)
