"""The decoder's KV cache (a pytree): its buffers, their layouts, and a shared prompt.

Split out of transformer.py, which re-exports it; the forward that reads and
writes it is `models/forward.py`'s.
"""

from __future__ import annotations

from typing import ClassVar

import flax
import jax

__all__ = ["KVCache"]


@flax.struct.dataclass
class KVCache:
    """Decode cache. k: f[L,B,Hkv,Dh,S] (keys transposed: slots last); v:
    f[L,B,Hkv,S,Dh]; mask: bool[B,S] (slot holds a real token); index: i32[] next
    slot to write, or i32[B] one per row (one-token steps only: continuous
    batching, rows at different steps). A pytree.

    Heads before slots so each (row, kv head) is one contiguous matrix, each in
    the order its attention dot contracts it (q @ k[Dh,S], p @ v[S,Dh]): the dots
    read the cache as it lies, as a plain [contracted, free] right operand.
    XLA:CPU's YNNPACK dots run a transposed right operand 2-3x slower
    (``python -m benchmarks.profile_kernels``, its table in docs/benchmarks.md).

    Stacked (k, v one array each, a leading [L] axis) or unstacked (k, v tuples
    of L per-layer arrays, ``unstacked()``): a forward over an unstacked cache
    runs its layers unrolled, and every matmul reads its layer's buffer where it
    lies. A stacked cache under the layer ``scan`` makes XLA:CPU copy each
    layer's slice out first (and the weights' too) at every step
    (``python -m benchmarks.profile_decode --trace``, its tables in docs/benchmarks.md).

    Shared prompt (optional ``prefix_*``): the U prompts' own cache, prefilled
    once, that rows read instead of a per-row copy; rows are prompt-major, R =
    B // U of them per prompt (row b answers prompt b // R), and k / v / mask
    then hold only the rows' own (decoded) slots. prefix_k: f[L,U,Hkv,Dh,P] (or
    L per-layer arrays), prefix_v: f[L,U,Hkv,P,Dh], prefix_mask: bool[U,P]. The
    R rows of a prompt read its slots once per step, not R times, and the cache
    holds them once (``DecodeSpec.group``, docs/sampling.md). Training's pass
    over shared prompts (``models.prompt_sharing``) is fresh and keeps no
    buffers of its own: k and v are None there (nothing is written).

    Shared prompt slots under continuous batching (``prefix_cell``): the U
    prefix entries are prompt *slots* that lanes (rows at different steps) map
    into, not prompt-major rows. Slot u has ``prefix_group`` cells; lane b sits
    in cell prefix_cell[b] (i32[B]; slot cell // prefix_group; a value >= U *
    prefix_group: an idle lane, it reads no slot). The rows in one slot's cells
    read its slots once per step, as prompt-major rows do
    (`sampling/continuous.py`).
    """

    # The slot axis of each buffer (where the cache grows).
    K_SLOT_AXIS: ClassVar[int] = 4
    V_SLOT_AXIS: ClassVar[int] = 3
    MASK_SLOT_AXIS: ClassVar[int] = 1

    k: jax.Array | tuple[jax.Array, ...] | None
    v: jax.Array | tuple[jax.Array, ...] | None
    mask: jax.Array
    index: jax.Array
    prefix_k: jax.Array | tuple[jax.Array, ...] | None = None
    prefix_v: jax.Array | tuple[jax.Array, ...] | None = None
    prefix_mask: jax.Array | None = None
    prefix_cell: jax.Array | None = None
    prefix_group: int = flax.struct.field(pytree_node=False, default=0)
    # Slots a step reads: the first read_slots (0: all). The static decode's
    # phases hold one cache of all slots and read a growing prefix of it.
    read_slots: int = flax.struct.field(pytree_node=False, default=0)

    @property
    def is_stacked(self) -> bool:
        return not isinstance(self.k, tuple)

    def unstacked(self) -> KVCache:
        """The same cache with k, v (and a shared prompt's) split into L
        per-layer arrays (one copy)."""
        if not self.is_stacked:
            return self
        split = lambda a: None if a is None else tuple(a[i] for i in range(a.shape[0]))  # noqa: E731
        return self.replace(
            k=split(self.k),
            v=split(self.v),
            prefix_k=split(self.prefix_k),
            prefix_v=split(self.prefix_v),
        )
