"""A training forward that runs each distinct prompt once, not once per completion.

A rollout batch holds G completions of every prompt, and the ordinary forward over
[prompt | completion] rows runs each prompt through every layer G times (with
its gradient, and again for the reference / old log-probs). Here the U distinct
prompts run once ([U, P], a fresh-cache prefill that keeps each layer's K/V),
then the B = U * G rows (each its prompt's last token and its completion) run
over them as a KVCache's shared prefix: every completion query reads its
prompt's keys and then its own, under one softmax (`_attention_shared_prefix`,
the decode's shared-prompt path). Autodiff sums the G rows' gradients into
their prompt's single forward. Under the layer scan both passes run in one
loop over the layers (`Transformer.forward_shared_prompt`: each layer runs the
prompts, then the rows over that layer's prompt K/V), so the stacked weights
are sliced once and no stacked prompt cache is written and read back; unrolled
layers keep the two calls (a prefill into per-layer buffers, the rows over them).

The maths is the per-row forward's; only the order of f32 sums differs (the
attention output is prompt part + own part; the prompt's weight gradients are
summed over U rows instead of B), about 1e-6 in f32. What it saves is the
prompt's share of the tokens times (G - 1) / G: little for short prompts,
most of the step for the paper's tool-calling prompts (up to 2048 tokens
against 1024 new ones). The completions' attention runs through the kernel
`model.attention` picks (`_attention_prefix_kernel`: splash over a prompt's rows
in one call that reads its K/V once, `splash.splash_prompt_rows`; cuDNN flash
attention over each row's [prompt | own] keys, the prompt's K/V repeated to its
rows), so no [B, Hq, C, P + C] scores are held under splash (TPU) or cuDNN (a
GPU in bf16 / f16); elsewhere (CPU, a GPU in f32, model.attention="xla") it is
the einsum path (`_attention_shared_prefix`), which holds them and reads each
prompt's keys once for its rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gdpo_jax.models.attention import attention_kind
from gdpo_jax.models.kvcache import KVCache
from gdpo_jax.models.splash import block_ceil
from gdpo_jax.models.transformer import Transformer, _constrain
from gdpo_jax.sharding import BATCH_AXES

__all__ = ["shared_prompt_hidden"]


def shared_prompt_hidden(
    model: Transformer,
    prompt_ids: jax.Array,
    prompt_mask: jax.Array,
    completion_ids: jax.Array,
    completion_mask: jax.Array,
    *,
    group: int,
    layer_params: tuple[dict[str, jax.Array], ...] | None = None,
    one_loop: bool | None = None,
) -> jax.Array:
    """Final-normed hidden states f[B, C, D] at the C positions that predict the
    completion's tokens (the last prompt position, then completion positions
    0..C-2): ``model(concat(prompt, completion))[:, P-1:-1]`` with each prompt run once.

    prompt_ids, prompt_mask i32[B, P] (left padded); completion_ids,
    completion_mask i32[B, C] (right padded). Rows are prompt-major: rows
    u*group .. u*group + group - 1 hold the same prompt (only row u*group's is
    read; ``step_config.check_group_prompts`` checks a host batch). B must be a
    multiple of `group`. layer_params: per-layer weights replacing the stacked
    ones in both passes (``Transformer.__call__``).

    one_loop: run the prompts' pass and the rows' in one loop over the layers
    (``Transformer.forward_shared_prompt``) rather than a prefill into a cache
    and a call over it; the same maths. Default: where the layers are a scan
    (stacked weights, no layer_params), whose weight slices the loop then reads
    once; unrolled layers keep the two calls.
    """
    (B, P), C = prompt_ids.shape, completion_ids.shape[1]
    if group < 1 or B % group:
        raise ValueError(f"shared_prompt_hidden: {B} rows are not whole groups of {group}.")
    U = B // group
    # The prefix is the prompt but its last column: that column (a real token:
    # prompts are left padded) opens each row's own pass, whose outputs are then
    # exactly the C predicting positions (no per-row copy of a prompt state).
    # The prefix pass still runs all P columns (the last one masked out of the
    # prefix), so a kernel sees the prompt width it was bucketed to.
    pid = prompt_ids.reshape(U, group, P)[:, 0]
    pmask = prompt_mask.reshape(U, group, P)[:, 0].astype(jnp.int32)
    pmask = pmask * (jnp.arange(P) < P - 1).astype(jnp.int32)
    if attention_kind(model.cfg) == "splash":
        # The splash kernel reads the rows' own keys from a block boundary. Pad the
        # prompt's tokens on the left (masked out) so its K/V come out of the prefix
        # pass block aligned. Padding the K/V instead puts a pad's gradient (a slice)
        # on the cache; on a sharded TPU with head_dim 128 libtpu then miscompiles the
        # step ("Bitcast cannot have different shape sizes", libtpu 0.0.42).
        pad = block_ceil(P) - P
        pid, pmask = (jnp.pad(x, ((0, 0), (pad, 0))) for x in (pid, pmask))
    pid, pmask = (_constrain(x, (BATCH_AXES, None)) for x in (pid, pmask))
    ids = jnp.concatenate([prompt_ids[:, -1:], completion_ids[:, :-1]], axis=1)
    mask = jnp.concatenate([prompt_mask[:, -1:], completion_mask[:, :-1]], axis=1)
    mask = mask.astype(jnp.int32)
    # Positions as in the per-row forward: the prefix's valid tokens come first.
    prefix_len = jnp.sum(prompt_mask[:, :-1].astype(jnp.int32), axis=1, keepdims=True)
    positions = jnp.maximum(prefix_len + jnp.cumsum(mask, axis=1) - 1, 0)
    if one_loop is None:
        one_loop = model.cfg.scan_layers and layer_params is None
    elif one_loop and layer_params is not None:
        raise ValueError(
            "shared_prompt_hidden: one_loop runs the stacked weights; drop layer_params."
        )
    if one_loop:  # both passes in one scan over the stacked layers
        return model.forward_shared_prompt(pid, pmask, ids, mask, positions)
    # init_cache places the buffers by the context mesh (batch-sharded).
    prefix = model.init_cache(U, pid.shape[1])
    if not model.cfg.scan_layers:
        # Per-layer buffers: the unrolled layers each write their own, and the
        # rows read them (no stacked [L, ...] buffer sliced per layer, nor its
        # gradient padded).
        prefix = prefix.unstacked()
    _, prefix = model(
        pid, pmask, cache=prefix, fresh_cache=True, return_hidden=True, layer_params=layer_params
    )
    # The rows' pass is fresh: it attends to its own new keys and the prompt's
    # cache, so it needs no buffers of its own (k, v None: nothing is written).
    own = KVCache(
        k=None,
        v=None,
        mask=jnp.zeros((B, C), bool),
        index=jnp.zeros((), jnp.int32),
        prefix_k=prefix.k,
        prefix_v=prefix.v,
        prefix_mask=prefix.mask,
    )
    hidden, _ = model(
        ids,
        mask,
        positions=positions,
        cache=own,
        fresh_cache=True,
        return_hidden=True,
        layer_params=layer_params,
    )
    return hidden
