"""Top-p's nucleus when rows lie beyond its candidates: the bisection of a few gathered
rows at a time, sharded (Auto and Explicit axes); on a GPU (compiled for a GPU target)
every row bisects in a fixed loop.

References: the nucleus from NumPy sorting (float64 masses), and each row alone.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from gdpo_jax.sampling.filters import (
    BISECT_CHUNKS,
    BISECT_ROWS,
    NUCLEUS_CANDIDATES,
    bisect_chunk,
    nucleus_mask,
    row_keys,
    sample_tokens,
)
from gdpo_jax.scale import targets as targets_lib

ROWS, VOCAB, TOP_P = 40, 300, 0.9


def mixed_logits(rows: int = ROWS, wide_every: int = 2, seed: int = 0) -> np.ndarray:
    """f32[rows, VOCAB]: peaked rows (nuclei of a few tokens) and, every
    `wide_every`-th row, a flat one whose nucleus lies beyond the candidates."""
    rng = np.random.default_rng(seed)
    lg = rng.normal(size=(rows, VOCAB)) * 8.0
    lg[::wide_every] /= 16.0
    return lg.astype(np.float32)


def reference_nucleus(lg: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """(mask, unsure) bool[B, V]: a token is in iff the mass of the strictly more
    likely ones is < top_p; `unsure` marks masses within f32 rounding of top_p."""
    p = np.exp(lg.astype(np.float64) - lg.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    above = np.sum(np.where(p[:, None, :] > p[:, :, None], p[:, None, :], 0.0), -1)
    return above < top_p, np.abs(above - top_p) < 1e-5


def test_rows_beyond_the_candidates_bisect_a_few_at_a_time():
    """20 of 40 rows need the bisection: more than two gathers of `BISECT_ROWS`.
    Every row's mask is the sorting reference's and the same as alone."""
    lg = mixed_logits()
    want, unsure = reference_nucleus(lg, TOP_P)
    sizes = want.sum(-1)
    wide = sizes > NUCLEUS_CANDIDATES
    assert wide.sum() > 2 * BISECT_ROWS and (~wide).sum() > 2 * BISECT_ROWS, sizes
    mask = jax.jit(nucleus_mask, static_argnums=1)  # one compile per shape, [1, V] for all rows
    got = np.asarray(mask(jnp.asarray(lg), TOP_P))
    np.testing.assert_array_equal(got[~unsure], want[~unsure])
    for r in range(ROWS):
        alone = np.asarray(mask(jnp.asarray(lg[r : r + 1]), TOP_P))[0]
        np.testing.assert_array_equal(alone, got[r])


def test_the_chunk_is_the_fewest_rows_that_hold_the_unsettled():
    got = [int(bisect_chunk(jnp.int32(n))) for n in (1, 2, 3, 4, 5, 8, 9, 20)]
    assert [BISECT_CHUNKS[i] for i in got] == [1, 2, 4, 4, 8, 8, 8, 8]


@pytest.mark.parametrize("n_wide", [1, 2, 3, 5])
def test_a_few_wide_rows_bisect_in_the_fewest_rows_that_hold_them(n_wide):
    """1, 2, 3 or 5 wide rows among 40 peaked ones: they bisect as a chunk of 1, 2, 4
    or 8 rows (`BISECT_CHUNKS`), padded with settled rows; every row's mask is the
    sorting reference's."""
    rng = np.random.default_rng(n_wide)
    lg = (rng.normal(size=(ROWS, VOCAB)) * 8.0).astype(np.float32)
    lg[rng.choice(ROWS, n_wide, replace=False)] /= 16.0
    want, unsure = reference_nucleus(lg, TOP_P)
    assert (want.sum(-1) > NUCLEUS_CANDIDATES).sum() == n_wide
    got = np.asarray(jax.jit(nucleus_mask, static_argnums=1)(jnp.asarray(lg), TOP_P))
    np.testing.assert_array_equal(got[~unsure], want[~unsure])


@pytest.mark.parametrize("form", ["candidates", "bisected"])
def test_both_forms_give_the_reference_nucleus(form):
    """The CPU's and TPU's form (candidates, then gathered rows) and the GPU's (every
    row bisected at once, run here on CPU through the same function) against the
    sorting reference."""
    from gdpo_jax.sampling import filters

    fn = {"candidates": filters._nucleus_from_candidates, "bisected": filters._nucleus_bisected}
    lg = mixed_logits()
    lg[3, :5] = -np.inf  # masked tokens: never in the nucleus
    want, unsure = reference_nucleus(lg, TOP_P)
    z = jnp.asarray(lg) - jnp.max(jnp.asarray(lg), axis=-1, keepdims=True)
    p = jnp.exp(z)
    got = np.asarray(jax.jit(fn[form])(z, p, TOP_P * jnp.sum(p, axis=-1)))
    np.testing.assert_array_equal(got[~unsure], want[~unsure])
    assert not got[3, :5].any()


@pytest.mark.parametrize("form", ["candidates", "bisected"])
@pytest.mark.parametrize("top_p", [1e-30, 1e-38, 1e-40])
def test_a_tiny_top_p_keeps_the_most_likely_token(form, top_p):
    """A subnormal top_p flushed `top_p * sum p` to 0 on XLA:CPU: the candidates' form
    kept no token and every row sampled token 0. The nucleus is the argmax, as greedy."""
    from gdpo_jax.sampling import filters

    fn = {"candidates": filters._nucleus_from_candidates, "bisected": filters._nucleus_bisected}
    lg = mixed_logits()
    z = jnp.asarray(lg) - jnp.max(jnp.asarray(lg), axis=-1, keepdims=True)
    p = jnp.exp(z)
    got = np.asarray(jax.jit(fn[form])(z, p, jnp.float32(top_p) * jnp.sum(p, axis=-1)))
    want = np.zeros_like(got)
    want[np.arange(ROWS), lg.argmax(-1)] = True
    np.testing.assert_array_equal(got, want)
    tokens, _ = sample_tokens(jnp.asarray(lg), jax.random.key(1), 1.0, jnp.float32(top_p))
    np.testing.assert_array_equal(np.asarray(tokens), lg.argmax(-1))


@pytest.mark.parametrize("form", ["candidates", "bisected"])
def test_the_most_likely_token_stays_when_fusions_round_z_differently(form, monkeypatch):
    """XLA may recompute z in each fusion that reads it. At -O0 on 8 CPU devices two
    fusions rounded it differently: top_k's values (the candidates' threshold) or the
    max taken as 0 (the bisection's start) lay a bit above the z the mask compares,
    the mask came out empty and rows sampled token 0. Both disagreements simulated:
    the nucleus still holds the most likely token, and sampling picks it."""
    from gdpo_jax.sampling import filters

    lg = mixed_logits(rows=8, wide_every=10**6)  # peaked rows only
    lg[:, 0] = -50.0  # token 0 is never likely: an empty mask would show as 0
    z = jnp.asarray(lg) - jnp.max(jnp.asarray(lg), axis=-1, keepdims=True)
    top_p = 1e-30  # the nucleus is the most likely token alone
    if form == "candidates":
        top_k = jax.lax.top_k

        def top_k_rounded_up(x, k):  # the values another fusion rounded up one ulp
            vals, idx = top_k(x, k)
            return jnp.nextafter(vals, jnp.float32(jnp.inf)), idx

        monkeypatch.setattr(jax.lax, "top_k", top_k_rounded_up)
        z = z - 1.0  # an ulp above 0 is subnormal, flushed to 0 on XLA:CPU
        fn = filters._nucleus_from_candidates
    else:
        # Its max a bit below the 0 the bisection starts at, and a target of 0 (a
        # subnormal top_p, flushed): the bisection never lowers its start.
        z, top_p = z - jnp.float32(1e-6), 1e-40
        fn = filters._nucleus_bisected
    p = jnp.exp(z)
    got = np.asarray(jax.jit(fn)(z, p, jnp.float32(top_p) * jnp.sum(p, axis=-1)))
    want = np.zeros_like(got)
    want[np.arange(8), lg.argmax(-1)] = True
    np.testing.assert_array_equal(got, want)
    drawn = filters.inverse_cdf_sample(jax.random.key(0), jnp.where(got, p, 0.0))
    np.testing.assert_array_equal(np.asarray(drawn), lg.argmax(-1))


def _loops_and_their_reductions(jaxpr, depth: int = 0, out=None) -> list[tuple[int, tuple]]:
    """(loop depth, operand shape) of every reduce_sum in a jaxpr, nested ones too."""
    out = [] if out is None else out
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "reduce_sum":
            out.append((depth, tuple(eqn.invars[0].aval.shape)))
        inner = depth + (eqn.primitive.name in ("while", "scan"))
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    _loops_and_their_reductions(sub.jaxpr, inner, out)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    _loops_and_their_reductions(sub, inner, out)
    return out


def test_bisection_sums_over_the_gathered_rows_only():
    """Off GPUs, the masked sums inside the bisection loops cover `BISECT_ROWS` rows,
    never the batch: one wide row no longer makes every row of the batch bisect."""
    from gdpo_jax.sampling.filters import _nucleus_from_candidates

    def loops(rows: int) -> set:
        def nucleus(z):
            p = jnp.exp(z)
            return _nucleus_from_candidates(z, p, TOP_P * jnp.sum(p, axis=-1))

        jaxpr = jax.make_jaxpr(nucleus)(jnp.zeros((rows, VOCAB)))
        return {s for d, s in _loops_and_their_reductions(jaxpr.jaxpr) if d > 0}

    cpu = loops(ROWS)
    assert (BISECT_ROWS, VOCAB) in cpu and (ROWS, VOCAB) not in cpu, cpu
    # A chunk is as few of BISECT_CHUNKS rows as hold the unsettled ones: one loop each.
    assert {(n, VOCAB) for n in BISECT_CHUNKS} <= cpu, cpu
    # A batch no larger than BISECT_ROWS bisects as it is (nothing to gather).
    assert loops(BISECT_ROWS)
    # The CPU's compiled program takes this form: its argsort of the rows' unsettled
    # flags is the program's only sort.
    hlo = jax.jit(lambda z: nucleus_mask(z, TOP_P)).lower(jnp.zeros((ROWS, VOCAB)))
    sorts = [x for x in hlo.compile().as_text().splitlines() if re.search(r"\bsort\(", x)]
    assert len(sorts) == 1 and f"pred[{ROWS}]" in sorts[0], sorts


@pytest.mark.xla_defaults  # the sharded program's fusions round z as its own
@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_sharded_rows_choose_as_on_one_device(axis_type):
    """Rows sharded 4 ways on a 2x2x2 mesh: the gathered rows come from every shard.
    Tokens and masks equal one device's, log-probs to f32 rounding (Explicit axes: the sort and the
    gather of the rows run under auto axes)."""
    lg = mixed_logits(rows=32, wide_every=3)
    key = jax.random.key(3)
    rows = jnp.arange(32, dtype=jnp.int32)

    def choose(z):
        tok, lp = sample_tokens(z, row_keys(key, rows, 0), 0.7, TOP_P)
        return tok, lp, nucleus_mask(z, TOP_P)

    want = jax.jit(choose)(jnp.asarray(lg))
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(axis_type,) * 3)
    with jax.set_mesh(mesh):
        z = jax.device_put(lg, NamedSharding(mesh, P(("data", "fsdp"))))
        got = jax.jit(choose)(z)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(got[2]), np.asarray(want[2]))


@pytest.mark.skipif(
    not targets_lib.has_module("jax_plugins.xla_cuda12"),
    reason='needs the [aot] extra: pip install -e ".[aot]"',
)
def test_gpu_top_p_bisects_every_row_in_a_fixed_loop():
    """Compiled for an H100 (no GPU needed): top-p on a GPU has no sort (64
    candidates made XLA:GPU sort all [B, V] logits, a cub radix sort, at every decode
    step), no TopK and no gathered rows (16 candidates and gathering were 1.1-20x
    slower on an H200), and one loop of a known trip count: 32 halvings, with no
    predicate read back at each step."""
    target = targets_lib.parse_target("cuda:1x1x1:h100")
    mesh = jax.sharding.Mesh(np.array(targets_lib.target_devices(target)), ("x",))
    z = jax.ShapeDtypeStruct((64, 4096), jnp.float32, sharding=NamedSharding(mesh, P()))
    step = jax.jit(lambda z: sample_tokens(z, jax.random.key(0), 0.6, TOP_P)[0])
    lines = step.lower(z).compile().as_text().splitlines()
    assert not [x for x in lines if re.search(r"\bsort\(|cub_sort|TopK", x)]
    loops = [x for x in lines if re.search(r"\bwhile\(", x)]
    assert len(loops) == 1 and '"known_trip_count":{"n":"32"}' in loops[0], loops


@pytest.mark.skipif(
    not targets_lib.has_module("libtpu"), reason='needs the [aot] extra: pip install -e ".[aot]"'
)
@pytest.mark.parametrize("top_k,top_p", [(0, TOP_P), (50, None), (50, TOP_P)])
def test_tpu_token_choice_selects_with_top_k_and_sorts_no_vocabulary(top_k, top_p):
    """Compiled for a TPU v5e (no TPU needed) at SmolLM2's vocabulary: top-p's 64
    candidates and top-k 50 are XLA's TopK custom call; the only sort is top-p's of
    the rows' unsettled flags (the gathered bisection), never one over the
    vocabulary. (At 4,096 tokens the TPU compiler lowers top-p's top_k to a sort.)"""
    target = targets_lib.parse_target("v5e-4")
    mesh = jax.sharding.Mesh(np.array(targets_lib.target_devices(target)), ("x",))
    z = jax.ShapeDtypeStruct((64, 49152), jnp.float32, sharding=NamedSharding(mesh, P()))
    step = jax.jit(lambda z: sample_tokens(z, jax.random.key(0), 0.6, top_p, top_k=top_k)[0])
    lines = step.lower(z).compile().as_text().splitlines()
    assert any('custom_call_target="TopK"' in x for x in lines)
    sorts = [x for x in lines if re.search(r"\bsort\(", x)]
    assert all("49152" not in x for x in sorts), sorts
    assert len(sorts) == (1 if top_k == 0 else 0), sorts  # top-p alone: the rows' flags
