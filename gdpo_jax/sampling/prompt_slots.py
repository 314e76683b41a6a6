"""Shared prompt slots for continuous batching: which lanes may start which rows,
into which slot, and the lanes' cells (`continuous.py`, "Shared prompt slots").

W slots each hold one prompt; lanes answering a prompt sit in cells (slot, rank
of the row among its prompt's rows) of a [W, G] grid (``KVCache.prefix_cell``).
Rows are prompt-major (row r answers prompt row_prompt[r], non-decreasing) and
are taken in order. The state (a dict of arrays, part of the decode loop's
carry): lane_slot i32[lanes] (a live lane's slot), slot_u i32[W] (the prompt a
slot holds or last held, -1: none yet) and u_open i32[] (the last taken row's
prompt: the newest loaded, so the one slot whose slot_u equals it holds it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def suggested_prompt_slots(lanes: int, group: int) -> int:
    """A W for `lanes` lanes of `group` rows per prompt that rarely makes rows
    wait: three times the prompts the lanes hold when full, at most one per lane.

    With bench_longtail's lengths (log-normal, median 24, log-std 1) it ran at
    most a few percent more steps than a copy per lane at G = 4 and 8, more at
    G = 16 (`python -m benchmarks.bench_longtail --reads` counts both).
    """
    return max(1, min(int(lanes), 3 * -(-int(lanes) // int(group))))


def prompt_slots_used(prompt_slots: int, share_prompt_cache: bool, group: int) -> int:
    """The W a call uses: `prompt_slots` when prompts are shared
    (share_prompt_cache) and have several rows (G > 1), else 0 (a prompt copy
    per lane). The Sampler and the planner both decide with this."""
    return int(prompt_slots) if share_prompt_cache and int(group) > 1 else 0


def init_state(lanes: int, n_slots: int, row_prompt: jax.Array) -> dict[str, jax.Array]:
    """No slot loaded; the open prompt is "the one before the first row's"."""
    return dict(
        lane_slot=jnp.zeros((lanes,), jnp.int32),
        slot_u=jnp.full((n_slots,), -1, jnp.int32),
        u_open=row_prompt[0] - 1,
    )


def take_rows(
    c: dict[str, jax.Array],
    take: jax.Array,
    u: jax.Array,
    live: jax.Array,
    row_prompt: jax.Array,
    n_active: jax.Array,
    n_prompts: int,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Which of the candidate lanes (`take` bool[lanes]: a free lane and a
    waiting row, rows u i32[lanes] of the prompts) start now, given the slots
    -> (take, slot i32[lanes] (the row's slot), free_slots i32[W] (the free
    slots, first), n_new i32[] (prompts to load into free_slots[:n_new])).

    A slot is free when no live lane reads it and its prompt has no waiting
    row (the open prompt keeps its slot while rows of it wait). A row of prompt
    u needs u - u_open new slots (consecutive prompts; a gap only wastes a
    slot), non-decreasing along the candidates, so those that fit are a prefix:
    rows still start in order.
    """
    n_slots = c["slot_u"].shape[0]
    n_rows = row_prompt.shape[0]
    users = jnp.zeros((n_slots,), jnp.int32).at[c["lane_slot"]].add(live.astype(jnp.int32))
    waiting = c["next"] < n_active
    u_next = jnp.where(waiting, row_prompt[jnp.clip(c["next"], 0, n_rows - 1)], n_prompts)
    slot_free = (users == 0) & (c["slot_u"] < u_next)
    need = u - c["u_open"]
    take = take & (need <= jnp.sum(slot_free.astype(jnp.int32)))
    free_slots = jnp.nonzero(slot_free, size=n_slots, fill_value=0)[0]
    open_slot = jnp.argmax(c["slot_u"] == c["u_open"])  # read only while u_open is loaded
    slot = jnp.where(need <= 0, open_slot, free_slots[jnp.clip(need - 1, 0, n_slots - 1)])
    last = c["next"] + jnp.sum(take.astype(jnp.int32)) - 1
    n_new = jnp.where(jnp.any(take), row_prompt[jnp.clip(last, 0, n_rows - 1)] - c["u_open"], 0)
    return take, slot, free_slots, n_new


def loaded(
    c: dict[str, jax.Array], take: jax.Array, slot: jax.Array, free_slots: jax.Array, n_new
) -> tuple[dict[str, jax.Array], jax.Array, jax.Array]:
    """The state after loading prompts u_open + 1 .. u_open + n_new into
    free_slots[:n_new] -> (state updates, new_u i32[W] (the i-th loaded
    prompt), dest i32[W] (its slot, or W past the n_new: a dropped write))."""
    n_slots = c["slot_u"].shape[0]
    new_u = c["u_open"] + 1 + jnp.arange(n_slots)
    dest = jnp.where(jnp.arange(n_slots) < n_new, free_slots, n_slots)
    updates = dict(
        lane_slot=jnp.where(take, slot, c["lane_slot"]),
        slot_u=c["slot_u"].at[dest].set(new_u, mode="drop"),
        u_open=c["u_open"] + n_new,
    )
    return updates, new_u, dest


def rank_in_prompt(row_prompt: jax.Array) -> jax.Array:
    """i32[N]: each row's rank among its prompt's rows (rows prompt-major)."""
    first = jnp.searchsorted(row_prompt, row_prompt, side="left").astype(jnp.int32)
    return jnp.arange(row_prompt.shape[0], dtype=jnp.int32) - first


def lane_cells(
    lane_slot: jax.Array, rank: jax.Array, live: jax.Array, group: int, n_slots: int
) -> jax.Array:
    """i32[lanes]: a live lane's cell, slot * G + its row's rank; an idle lane's
    a distinct cell past the W * G grid (it reads no slot:
    `attention._attention_shared_prefix`)."""
    idle = n_slots * group + jnp.arange(lane_slot.shape[0], dtype=jnp.int32)
    return jnp.where(live, lane_slot * group + rank, idle)
