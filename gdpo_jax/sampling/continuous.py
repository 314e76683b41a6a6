"""Continuous batching: a fixed set of decode slots that finished rows hand over.

The static decode (`decode.py`) runs every row of a call until the longest
ends: with long-tailed lengths (most answers short, a few at the cap) most
decoded tokens are padding. Here B slots (lanes) decode at once; when a lane's
row finishes, the next waiting row takes the lane at the next step, inside
the same compiled ``while_loop`` (static shapes throughout):

  * every distinct prompt is prefilled once up front into a prompt cache
    (U rows, P slots) with its last logits [U, V];
  * a refill copies the row's prompt cache into slots [0, P) of the lane's
    cache (k [L, B, Hkv, Dh, S], v [L, B, Hkv, S, Dh]), masks slots P.. out,
    and restarts the lane's step counter; the lane's t-th token goes to slot
    P + t (a per-row cache index, `KVCache.index` i32[B]) at position
    prompt_len + t;
  * the cache grows in phases, as in the static decode (``DecodeSpec.chunks``,
    ends E_0 < ... < E_{K-1} = M): phase j reads P + E_j slots, and its
    loop runs until a live lane's counter reaches E_j; then the next phase
    reads more (``DecodeSpec.growth``: a longer prefix of one cache, or a
    longer copy, as decode.py's). Early steps, and whole runs whose rows
    stay short, do not attend over (read) slots no lane has reached (with
    a cap of 512 and long-tailed lengths, a full-length cache made each
    step cost about 1.9x a static step: docs/benchmarks.md, bench_longtail);
  * rows are taken in order (row r before r + 1); outputs are scattered to
    their row, so the result has the static decode's layout [N, M].

Shared prompt slots (``prompt_slots`` W > 0 with rows_per_prompt G > 1; the
Sampler's ``continuous_prompt_slots``): a copy of the prompt per lane makes
every lane read P prompt slots per step, though G lanes often answer the same
prompt (at 2048-token prompts and G = 8 the copies read more KV than the
static decode: ``python -m benchmarks.bench_longtail --reads``). Instead W
prompt slots hold one prompt each, loaded once from the prompt cache; a
lane's cache holds only its own decode slots, and the lane sits in cell
(slot, rank of its row among the prompt's rows) of a [W, G] grid
(``KVCache.prefix_cell``): a slot's rows read its prompt once per step
(`attention._attention_shared_prefix`). A slot is freed when its prompt has
no live and no waiting rows; a row starts only if its prompt holds a slot or
a slot is free (rows are taken in order, so the rows that start are a prefix
of the waiting ones). The prompt part's matmuls run over all W x G cells, the
empty ones too: fewer KV reads per step, more FLOPs (docs/sampling.md has the
trade-off, and `prompt_slots.py` the slots' bookkeeping and a W that rarely
makes rows wait).

Greedy rows equal the static decode's row for row (same prompt logits, same
per-row maths; tests/test_sampler.py checks it). Sampled rows draw from the
static decode's per-row streams (``filters.row_keys``: the row's id and its own
token index), so a row's randomness does not depend on which lane or step it
ran in, and sampled rows equal the static decode's too.

Under a mesh of several devices every batch shard runs this loop over its own
rows and lanes (`_sharded`); `row` indexes the shard's own rows, and its random
stream uses `ids[row]` (the shard's offset plus that index, or the row ids
passed in), so the rows do not depend on the mesh either.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from gdpo_jax import sharding as mesh_lib
from gdpo_jax.sampling import prompt_slots as slots_lib
from gdpo_jax.sampling.decode import (
    FINISH_EOS,
    FINISH_LENGTH,
    FINISH_STOP,
    DecodeSpec,
    grow_cache,
    weights_in,
)
from gdpo_jax.sampling.filters import row_keys, sample_tokens, stop_sequence_hit


def make_continuous_generate_fn(
    graphdef: nnx.GraphDef,
    spec: DecodeSpec,
    slots: int,
    on_trace: Callable[[], None] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    rows_per_prompt: int = 1,
    prompt_slots: int = 0,
) -> Callable[..., dict[str, jax.Array]]:
    """Jitted ``generate`` with `decode.make_generate_fn`'s arguments and outputs,
    decoding with `slots` lanes (per batch shard under a mesh); also returns
    "row_steps" (lane-steps that produced a token) and "lane_steps" (steps x
    lanes, summed over shards). "steps" is the longest shard's.

    Under a mesh of several devices (`_sharded`) every batch shard ("data" x
    "fsdp") runs its own rows through its own lanes, with the weights gathered
    once per call; `rows_per_prompt` (the G of prompt-major rows) bounds how
    many prompts a shard's rows read, so each shard prefills only those.

    prompt_slots W > 0 (with `rows_per_prompt` G > 1): lanes read their prompts
    from min(W, lanes) shared prompt slots (per batch shard) instead of a copy
    per lane (module docstring, "Shared prompt slots").
    """
    m_new = spec.max_new_tokens
    group = int(rows_per_prompt) if prompt_slots > 0 and rows_per_prompt > 1 else 0

    def generate(
        state,
        prompt_ids,
        prompt_mask,
        row_prompt,
        active,
        key,
        temperature,
        top_p,
        eos_ids,
        stop_ids,
        stop_seqs,
        row_limit,
        row_ids=None,
        *,
        shard_offset=0,
    ) -> dict[str, jax.Array]:
        """One device's decode of its rows; row_ids i32[rows] their ids (random
        streams: decode.make_generate_fn), by default shard_offset + their index."""
        if on_trace is not None:
            on_trace()
        if spec.layers != "scan":  # weights copied once, in the compute dtype (decode.py)
            state = weights_in(state, nnx.merge(graphdef, state).cfg.dtype)
        model = nnx.merge(graphdef, state)
        n_prompts, plen = prompt_ids.shape
        n_rows = row_prompt.shape[0]
        lanes = min(int(slots), n_rows)
        n_active = jnp.sum(active.astype(jnp.int32))  # active rows come first
        ids = shard_offset + jnp.arange(n_rows, dtype=jnp.int32) if row_ids is None else row_ids
        prompt_mask = prompt_mask.astype(jnp.int32)
        positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
        hidden, pcache = model(
            prompt_ids,
            prompt_mask,
            positions=positions,
            cache=model.init_cache(n_prompts, plen),
            return_hidden=True,
            fresh_cache=True,
        )
        from gdpo_jax.core.logprobs import unembed_logits

        p_logits = unembed_logits(hidden[:, -1], model.unembed_matrix()).astype(jnp.float32)
        p_len = jnp.sum(prompt_mask, axis=1)
        ends = [int(e) for e in np.cumsum(spec.chunks)]  # phase j: P + ends[j] slots
        base = 0 if group else plen  # a lane's first own slot (after its prompt copy)
        prefix_growth = spec.growth == "prefix" and len(ends) > 1  # as decode.py's
        cache0 = model.init_cache(lanes, base + (ends[-1] if prefix_growth else ends[0]))
        n_slots = min(int(prompt_slots), lanes) if group else 0
        if group:  # the prompt slots, and each row's cell in its prompt's slot
            ps = model.init_cache(n_slots, plen)
            cache0 = cache0.replace(
                prefix_k=ps.k,
                prefix_v=ps.v,
                prefix_mask=jnp.zeros((n_slots, plen), bool),
                prefix_cell=jnp.arange(lanes, dtype=jnp.int32) + n_slots * group,
                prefix_group=group,
            )
            rank = slots_lib.rank_in_prompt(row_prompt)  # < G: rows are prompt-major
        layer_params = None
        if spec.layers != "scan":  # per-layer buffers and weights (decode.py's docstring)
            cache0 = cache0.unstacked()
            layer_params = model.layer_params(fuse=spec.layers == "fused")
        top_p_arg = top_p if spec.use_top_p else None
        win = max(int(stop_seqs.shape[1]), 1)

        def put_prompt(kv, b, pu):
            """Prompt pu's prefilled K/V (pcache) into batch entry b of the
            buffers kv = (k, v), stacked or per layer (in place: one entry)."""
            if isinstance(kv[0], tuple):  # unstacked: entry b of each layer's buffer
                return tuple(
                    tuple(
                        jax.lax.dynamic_update_slice(
                            x, px[i, pu][None].astype(x.dtype), (b, 0, 0, 0)
                        )
                        for i, x in enumerate(xs)
                    )
                    for xs, px in zip(kv, (pcache.k, pcache.v))
                )
            return tuple(
                jax.lax.dynamic_update_slice(
                    x,
                    jax.lax.dynamic_slice_in_dim(px, pu, 1, axis=1).astype(x.dtype),
                    (0, b, 0, 0, 0),
                )
                for x, px in zip(kv, (pcache.k, pcache.v))
            )

        def load_slots(c, take, u):
            """Shared prompt slots: the rows that fit start, and their new prompts'
            K/V are copied into free slots (once per prompt, not per row)."""
            live = c["row"] >= 0
            take, slot, free_slots, n_new = slots_lib.take_rows(
                c, take, u, live, row_prompt, n_active, n_prompts
            )
            updates, new_u, dest = slots_lib.loaded(c, take, slot, free_slots, n_new)
            cache = c["cache"]
            pk, pv = jax.lax.fori_loop(
                0,
                n_new,
                lambda i, kv: put_prompt(kv, free_slots[i], new_u[i]),
                (cache.prefix_k, cache.prefix_v),
            )
            pmask = cache.prefix_mask.at[dest].set(
                prompt_mask[jnp.clip(new_u, 0, n_prompts - 1)].astype(bool), mode="drop"
            )
            cache = cache.replace(prefix_k=pk, prefix_v=pv, prefix_mask=pmask)
            return take, dict(updates, cache=cache)

        def load_lanes(c, take, u):
            """Each taken lane's prompt cache copied into its slots [0, P)."""
            cache = c["cache"]
            # Only the refilled lanes' slots [0, P) are written (in-place slice
            # updates, one lane per iteration): an all-lane gather + scatter, or
            # a cond that rewrites every lane, measured 1.4-1.9x slower per step
            # (docs/benchmarks.md, bench_longtail).
            n_take = jnp.sum(take.astype(jnp.int32))
            order = jnp.nonzero(take, size=lanes, fill_value=0)[0]
            k, v = jax.lax.fori_loop(
                0, n_take, lambda j, kv: put_prompt(kv, order[j], u[order[j]]), (cache.k, cache.v)
            )
            return take, dict(cache=cache.replace(k=k, v=v))

        def refill(c):
            # Free lanes take waiting rows in row order (row `next` first).
            free = c["row"] < 0
            cand = c["next"] + jnp.cumsum(free.astype(jnp.int32)) - 1
            take = free & (cand < n_active)
            u = row_prompt[jnp.clip(cand, 0, n_rows - 1)]
            take, updates = (load_slots if group else load_lanes)(c, take, u)
            c = dict(c, **updates)
            cache = c["cache"]
            # The cache's decode slots: this phase's under "copy" growth, all M
            # under "prefix" (one cache, each phase reads a prefix of it).
            own = cache.mask.shape[1] - base
            prompt_part = [] if group else [prompt_mask[u].astype(bool)]
            fresh = jnp.concatenate([*prompt_part, jnp.zeros((lanes, own), bool)], axis=1)
            mask = jnp.where(take[:, None], fresh, cache.mask)
            return dict(
                c,
                row=jnp.where(take, cand, c["row"]),
                t=jnp.where(take, 0, c["t"]),
                plen=jnp.where(take, p_len[u], c["plen"]),
                logits=jnp.where(take[:, None], p_logits[u], c["logits"]),
                window=jnp.where(take[:, None], -2, c["window"]),
                next=c["next"] + jnp.sum(take.astype(jnp.int32)),
                cache=cache.replace(mask=mask),
            )

        def body(c):
            # No-op lanes cost nothing: the copy loop runs n_take times (shared
            # prompt slots: once per newly loaded prompt).
            c = refill(c)
            live = c["row"] >= 0
            row, t = jnp.maximum(c["row"], 0), c["t"]
            if spec.greedy:  # no randomness: one batched call, no per-row keys
                tok, lp = sample_tokens(
                    c["logits"], key, temperature, top_p_arg, top_k=spec.top_k, greedy=True
                )
            else:  # each lane's row draws from its own stream (as the static decode's)
                keys = row_keys(key, ids[row], t)
                tok, lp = sample_tokens(
                    c["logits"], keys, temperature, top_p_arg, top_k=spec.top_k, greedy=False
                )
            tok = tok.astype(jnp.int32)
            tok = jnp.where(live, tok, spec.pad_id)
            window = jnp.concatenate([c["window"][:, 1:], tok[:, None]], axis=1)
            is_eos = jnp.isin(tok, eos_ids) if eos_ids.shape[0] else jnp.zeros_like(live)
            is_stop = stop_sequence_hit(window, stop_seqs)
            if stop_ids.shape[0]:
                is_stop = is_stop | jnp.isin(tok, stop_ids)
            out_row = jnp.where(live, c["row"], n_rows)  # row n_rows: a dump row
            code = jnp.where(is_eos, FINISH_EOS, jnp.where(is_stop, FINISH_STOP, FINISH_LENGTH))
            ended = live & (is_eos | is_stop | (t + 1 >= row_limit[row]))
            new = dict(
                c,
                tokens=c["tokens"].at[out_row, t].set(tok),
                logprobs=c["logprobs"].at[out_row, t].set(jnp.where(live, lp, 0.0)),
                lengths=c["lengths"].at[out_row].set(t + 1),
                finish=c["finish"].at[out_row].set(code),
                window=window,
                steps=c["steps"] + 1,
                row_steps=c["row_steps"] + jnp.sum(live.astype(jnp.int32)),
            )
            cache = c["cache"]
            # Live lanes fit (t < this phase's end); an idle lane's write is clamped.
            slot = jnp.minimum(base + t, (cache.read_slots or cache.mask.shape[1]) - 1)
            cache = cache.replace(index=slot)
            if group:  # a live lane's cell: (its prompt's slot, its row's rank)
                cells = slots_lib.lane_cells(c["lane_slot"], rank[row], live, group, n_slots)
                cache = cache.replace(prefix_cell=cells)
            logits, cache = model(
                tok[:, None],
                live.astype(jnp.int32)[:, None],
                positions=(c["plen"] + t)[:, None],
                cache=cache,
                layer_params=layer_params,
            )
            new["logits"] = logits[:, -1].astype(jnp.float32)
            new["cache"] = cache
            new["t"] = jnp.where(live, t + 1, t)
            new["row"] = jnp.where(ended, -1, c["row"])
            return new

        init = dict(
            row=jnp.full((lanes,), -1, jnp.int32),
            t=jnp.zeros((lanes,), jnp.int32),
            plen=jnp.zeros((lanes,), jnp.int32),
            logits=jnp.zeros((lanes, p_logits.shape[-1]), jnp.float32),
            window=jnp.full((lanes, win), -2, jnp.int32),
            next=jnp.zeros((), jnp.int32),
            steps=jnp.zeros((), jnp.int32),
            row_steps=jnp.zeros((), jnp.int32),
            tokens=jnp.full((n_rows + 1, m_new), spec.pad_id, jnp.int32),
            logprobs=jnp.zeros((n_rows + 1, m_new), jnp.float32),
            lengths=jnp.zeros((n_rows + 1,), jnp.int32),
            finish=jnp.full((n_rows + 1,), FINISH_LENGTH, jnp.int32),
            cache=cache0.replace(index=jnp.zeros((lanes,), jnp.int32)),
        )
        if group:
            init.update(slots_lib.init_state(lanes, n_slots, row_prompt))

        def cond(c, end, last):
            work = (c["next"] < n_active) | jnp.any(c["row"] >= 0)
            if last:
                return work
            return work & jnp.all((c["row"] < 0) | (c["t"] < end))  # every live lane fits

        out = init
        for j, end in enumerate(ends):
            last = j == len(ends) - 1
            if prefix_growth:  # the phase reads the cache's first slots
                out["cache"] = out["cache"].replace(read_slots=base + end)
            elif j:  # a lane reached the phase's end (or all work is done): grow
                out["cache"] = grow_cache(out["cache"], base + end)
            out = jax.lax.while_loop(lambda c, end=end, last=last: cond(c, end, last), body, out)
        return dict(
            tokens=out["tokens"][:n_rows],
            logprobs=out["logprobs"][:n_rows],
            finish=out["finish"][:n_rows],
            lengths=out["lengths"][:n_rows],
            steps=out["steps"],
            row_steps=out["row_steps"],
            lane_steps=out["steps"] * lanes,
        )

    if mesh is None or mesh.devices.size == 1:
        return jax.jit(generate)
    return jax.jit(_sharded(generate, mesh, rows_per_prompt))


def _sharded(generate: Callable, mesh: jax.sharding.Mesh, group: int) -> Callable:
    """`generate` run per batch shard (`jax.shard_map`): rows, their budgets and
    outputs split over ("data", "fsdp"); prompts, weights and key whole on every
    device (the weights are gathered once per call: inside the loop no device
    waits on another, so each shard decodes until its own rows are done).

    Rows are prompt-major and a shard's are contiguous, so they read a window of
    at most ceil(rows / G) + 1 prompts: only that window is prefilled. A row's
    key folds in its global index, so sampled rows do not depend on the mesh.
    """
    rows, rep = P(mesh_lib.batch_axes(mesh)), P()
    counters = ("steps", "row_steps", "lane_steps")

    def local(state, prompt_ids, prompt_mask, row_prompt, *rest):
        n_local, n_prompts = row_prompt.shape[0], prompt_ids.shape[0]
        width = min(n_prompts, -(-n_local // group) + 1)
        lo = jnp.clip(jnp.min(row_prompt), 0, n_prompts - width)
        ids = jax.lax.dynamic_slice_in_dim(prompt_ids, lo, width)
        pmask = jax.lax.dynamic_slice_in_dim(prompt_mask, lo, width)
        shard = jax.lax.axis_index(mesh_lib.batch_axes(mesh))
        out = generate(state, ids, pmask, row_prompt - lo, *rest, shard_offset=shard * n_local)
        return {k: v[None] if k in counters else v for k, v in out.items()}

    def sharded(state, prompt_ids, prompt_mask, row_prompt, active, key, *rest):
        # rest: temperature, top_p, eos_ids, stop_ids, stop_seqs (whole), row_limit
        # and row_ids (rows) when given
        specs = (rep, rep, rep, rows, rows, rep) + (rep,) * 5 + (rows,) * (len(rest) - 5)
        args = (state, prompt_ids, prompt_mask, row_prompt, active, key, *rest)
        # Explicit axes: each input takes its spec (the weights' all-gather) before the map.
        args = tuple(
            jax.tree.map(lambda x, spec=spec: mesh_lib.constrain(x, mesh, spec), a)
            for a, spec in zip(args, specs)
        )
        out = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=rows, check_vma=False)(
            *args
        )
        return dict(
            out,
            steps=jnp.max(out["steps"]),
            row_steps=jnp.sum(out["row_steps"]),
            lane_steps=jnp.sum(out["lane_steps"]),
        )

    return sharded
