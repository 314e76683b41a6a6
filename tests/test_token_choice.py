"""Top-p's nucleus when rows lie beyond its candidates: the bisection of a few gathered
rows at a time, sharded (Auto and Explicit axes) and compiled for a GPU target.

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
    BISECT_ROWS,
    NUCLEUS_CANDIDATES,
    NUCLEUS_CANDIDATES_GPU,
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
    got = np.asarray(jax.jit(nucleus_mask, static_argnums=1)(jnp.asarray(lg), TOP_P))
    np.testing.assert_array_equal(got[~unsure], want[~unsure])
    for r in range(ROWS):
        alone = np.asarray(nucleus_mask(jnp.asarray(lg[r : r + 1]), TOP_P))[0]
        np.testing.assert_array_equal(alone, got[r])


def _loops_and_their_reductions(jaxpr, depth: int = 0, out=None) -> list[tuple[int, tuple]]:
    """(while-loop depth, operand shape) of every reduce_sum in a jaxpr, nested ones too."""
    out = [] if out is None else out
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "reduce_sum":
            out.append((depth, tuple(eqn.invars[0].aval.shape)))
        inner = depth + (eqn.primitive.name == "while")
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    _loops_and_their_reductions(sub.jaxpr, inner, out)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    _loops_and_their_reductions(sub, inner, out)
    return out


def test_bisection_sums_over_the_gathered_rows_only():
    """The masked sums inside the bisection loops cover `BISECT_ROWS` rows, never the
    batch: one wide row no longer makes every row of the batch bisect."""
    jaxpr = jax.make_jaxpr(lambda z: nucleus_mask(z, TOP_P))(jnp.zeros((ROWS, VOCAB)))
    sums = _loops_and_their_reductions(jaxpr.jaxpr)
    in_loops = {shape for depth, shape in sums if depth > 0}
    assert (BISECT_ROWS, VOCAB) in in_loops, sums
    assert (ROWS, VOCAB) not in in_loops, sums
    # A batch no larger than BISECT_ROWS bisects as it is (nothing to gather).
    small = jax.make_jaxpr(lambda z: nucleus_mask(z, TOP_P))(jnp.zeros((BISECT_ROWS, VOCAB)))
    assert any(d > 0 for d, _ in _loops_and_their_reductions(small.jaxpr))


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
def test_gpu_top_p_takes_the_top_k_kernel_not_a_vocabulary_sort():
    """Compiled for an H100 (no GPU needed): top-p's candidates use XLA:GPU's TopK
    kernel (k <= 16). With 64 candidates XLA:GPU sorted all [B, V] logits (a cub
    radix sort) at every decode step; the only sort left orders the rows' flags."""
    target = targets_lib.parse_target("cuda:1x1x1:h100")
    mesh = jax.sharding.Mesh(np.array(targets_lib.target_devices(target)), ("x",))
    z = jax.ShapeDtypeStruct((64, 4096), jnp.float32, sharding=NamedSharding(mesh, P()))
    step = jax.jit(lambda z: sample_tokens(z, jax.random.key(0), 0.6, TOP_P)[0])
    hlo = step.lower(z).compile().as_text()
    lines = hlo.splitlines()
    sorts = [line for line in lines if re.search(r"\bsort\(|cub_sort", line)]
    assert all("4096" not in line for line in sorts), sorts
    top_k = [line for line in lines if 'custom_call_target="__gpu$TopK"' in line]
    assert top_k and all(f"f32[64,{NUCLEUS_CANDIDATES_GPU}]" in line for line in top_k), top_k
