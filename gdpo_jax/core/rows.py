"""Row / group-id checks shared by the group-statistics functions (static, at trace time).

Every function taking rows [N] with group ids i32[N] and a static `num_groups`
validates them here, so the errors read the same everywhere.
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["check_group_ids", "check_num_groups", "check_valid", "row_mask"]


def check_group_ids(group_ids: Any, n: int) -> jax.Array:
    group_ids = jnp.asarray(group_ids)
    if group_ids.ndim != 1 or group_ids.shape[0] != n:
        raise ValueError(
            f"group_ids must have shape [N]=[{n}] (one id per row of rewards); "
            f"got shape {tuple(group_ids.shape)}."
        )
    if not jnp.issubdtype(group_ids.dtype, jnp.integer):
        raise ValueError(
            f"group_ids must be an integer array (int32 prompt/group index); got "
            f"dtype {group_ids.dtype}. Cast with group_ids.astype(jnp.int32)."
        )
    return group_ids.astype(jnp.int32)


def check_num_groups(num_groups: Any) -> int:
    try:
        num_groups = operator.index(num_groups)
    except TypeError:
        raise ValueError(
            f"num_groups must be a static Python int (e.g. num_prompts); got "
            f"{type(num_groups).__name__}. It sizes the segment tables, so it "
            f"cannot be traced."
        ) from None
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1; got {num_groups}.")
    return num_groups


def check_valid(valid: Any, n: int, name: str = "valid") -> jax.Array:
    if valid is None:
        return jnp.ones((n,), bool)
    valid = jnp.asarray(valid)
    if valid.shape != (n,):
        raise ValueError(f"{name} must have shape [N]=[{n}]; got {tuple(valid.shape)}.")
    return valid.astype(bool)


def row_mask(group_ids: jax.Array, valid: jax.Array, num_groups: int) -> jax.Array:
    """Rows that take part: valid and with an in-range group id (-1 = padding)."""
    return valid & (group_ids >= 0) & (group_ids < num_groups)
