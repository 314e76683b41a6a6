"""Top-k through blocks (gdpo_jax/sampling/topk.py) against NumPy's stable order."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from gdpo_jax.sampling import topk
from gdpo_jax.sampling.filters import sample_tokens, top_k_candidates
from tests._hlo import custom_call_targets


def numpy_top_k(z: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest of each row, ties by ascending index (a stable sort of -z)."""
    ids = np.argsort(-z, axis=-1, kind="stable")[:, :k]
    return np.take_along_axis(z, ids, axis=-1), ids


@pytest.mark.parametrize(
    "vocab,k,want",
    [
        (2048, 50, 0),  # under BLOCKS_MIN_VOCAB: one TopK
        (49152, 50, 32),  # 2 sqrt(983.04) = 62.7
        (151936, 50, 64),  # 2 sqrt(3038.72) = 110.2; 151,936 = 64 x 2,374
        (151936, 64, 64),  # 2 sqrt(2374) = 97.4
        (128256, 50, 64),  # 2 sqrt(2565.12) = 101.3; 128,256 = 2^8 x 501
        (32000, 50, 32),  # 2 sqrt(640) = 50.6
        (50257, 50, 0),  # odd: no power of two divides it
        (16384, 1000, 8),  # 2 sqrt(16.384) = 8.1
        (16384, 4096, 0),  # 2 sqrt(4) = 4: under MIN_BLOCK
        (16384, 0, 0),
    ],
)
def test_block_width_hand_worked(vocab, k, want):
    assert topk.block_width(vocab, k) == want


def _logits(kind: str, rows: int, vocab: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    z = rng.normal(size=(rows, vocab)).astype(np.float32) * 3
    if kind == "ties":  # a handful of values: ties across blocks at the k-th
        z = rng.integers(0, 5, size=(rows, vocab)).astype(np.float32)
    elif kind == "one block":  # every top token of row 0 in one block, row 1's in two
        z[0, 96:160] += 100.0
        z[1, 5:9] += 50.0
        z[1, -40:] += 50.0
    elif kind == "ties out of order":  # the kept blocks by maxima: a later block first
        w = 32  # block_width(16384, 50); other widths only move the blocks
        z[0] = -10.0
        z[0, 100 * w : 101 * w] = 1.0
        z[0, 100 * w] = 5.0  # the largest maximum, in block 100
        z[0, 3 * w : 4 * w] = 1.0
        z[0, 3 * w] = 4.0  # the next, in block 3: of the 62 ones tied at the k-th, the
        # 48 kept are block 3's 31 and block 100's first 17
    elif kind == "-inf":  # masked tokens, whole blocks of them
        z[:, : vocab // 2] = -np.inf
        z[2] = -np.inf
        z[2, 7] = 0.0
    return z


@pytest.mark.parametrize("kind", ["normal", "ties", "ties out of order", "one block", "-inf"])
@pytest.mark.parametrize("vocab,k", [(16384, 50), (16384, 64), (49152, 1), (16384, 1000)])
def test_top_k_is_numpys_stable_order(kind, vocab, k):
    """Values and ids equal the k first of a stable sort of -z: the kept blocks hold
    every top token, and ties come lowest id first, as jax.lax.top_k's."""
    assert topk.block_width(vocab, k)  # the blocks are taken
    z = _logits(kind, 4, vocab)
    vals, ids = jax.jit(lambda z: topk.top_k(z, k))(jnp.asarray(z))
    want_vals, want_ids = numpy_top_k(z, k)
    np.testing.assert_array_equal(np.asarray(ids), want_ids)
    np.testing.assert_array_equal(np.asarray(vals), want_vals)
    assert ids.dtype == jnp.int32


def test_the_cpu_program_selects_twice_from_blocks_not_once_from_the_row():
    """On CPU a large vocabulary takes two TopK calls (the blocks' maxima, then the
    kept blocks' tokens) and no sort of the row; a small one keeps one TopK."""

    def lowered(rows: int, vocab: int):
        return jax.jit(lambda z: topk.top_k(z, 50)).lower(jnp.zeros((rows, vocab)))

    big = lowered(8, 49152)
    # Inputs: the 1,536 blocks' maxima of 32 tokens, then 50 kept blocks' 1,600 tokens.
    calls = [line.split(" : ")[1] for line in big.as_text().splitlines() if "chlo.top_k(" in line]
    assert [c.split(" -> ")[0] for c in calls] == ["tensor<8x1536xf32>", "tensor<8x1600xf32>"]
    compiled = big.compile().as_text()
    assert custom_call_targets(compiled) == ["TopK", "TopK"]
    sorts = [line for line in compiled.splitlines() if " sort(" in line]
    assert len(sorts) == 1 and "s32[8,50]" in sorts[0], sorts  # the kept blocks' ids
    small = lowered(8, 2048).compile().as_text()
    assert custom_call_targets(small) == ["TopK"]


def test_sampling_uses_the_blocked_candidates():
    """top-k sampling and top-p's candidates go through `topk.top_k`: the same
    candidates as NumPy's order, and the step's program selects from blocks."""
    z = _logits("ties", 4, 16384)
    w, ids = top_k_candidates(jnp.asarray(z), 50, None)
    np.testing.assert_array_equal(np.asarray(ids), numpy_top_k(z, 50)[1])
    for top_k, top_p in ((50, None), (0, 0.9)):
        f = jax.jit(lambda z, key, tk=top_k, tp=top_p: sample_tokens(z, key, 1.0, tp, top_k=tk))
        hlo = f.lower(jnp.zeros((16, 16384)), jax.random.key(0)).compile().as_text()
        assert custom_call_targets(hlo).count("TopK") == 2, (top_k, top_p)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_rows_sharded_select_as_on_one_device(axis_type):
    z = _logits("ties", 8, 16384)
    want_vals, want_ids = numpy_top_k(z, 50)
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(axis_type,) * 3)
    with jax.set_mesh(mesh):
        x = jax.device_put(z, NamedSharding(mesh, P(("data", "fsdp"))))
        vals, ids = jax.jit(lambda z: topk.top_k(z, 50))(x)
    np.testing.assert_array_equal(np.asarray(ids), want_ids)
    np.testing.assert_array_equal(np.asarray(vals), want_vals)
