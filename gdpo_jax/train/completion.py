"""Per-token log-probs and entropies of completions under a model: the forward
shared by the RL step, the reference / old-policy pass and SFT.

One forward over prompt + completion; only the C positions that predict a
completion token are unembedded (the prompt's logits are never made).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from gdpo_jax.core.logprobs import (
    chunked_token_logprobs,
    token_entropy,
    token_logprobs,
    unembed_logits,
)
from gdpo_jax.models.prompt_sharing import shared_prompt_hidden

__all__ = ["completion_logprobs"]


def completion_logprobs(
    model: nnx.Module,
    batch: dict[str, jax.Array],
    *,
    temperature: float = 1.0,
    chunk_size: int = 0,
    group: int = 0,
    layer_params: tuple[dict[str, Any], ...] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Per-token log-probs and entropies of the completion under `model`.

    batch: prompt_ids, prompt_mask i32[B, P] (left padded); completion_ids,
    completion_mask i32[B, C] (right padded).
    group > 1: rows are prompt-major groups of `group` rows sharing a prompt,
    and each prompt runs once (`models.prompt_sharing`; same maths).
    layer_params: per-layer weights (``Transformer.layer_params`` or
    ``train.layer_views``) that replace the model's stacked ones, so a caller
    looping over micro-batches slices them once.
    Returns (logp f32[B, C], entropy f32[B, C]).
    """
    if group > 1:
        hidden = shared_prompt_hidden(
            model,
            batch["prompt_ids"],
            batch["prompt_mask"],
            batch["completion_ids"],
            batch["completion_mask"],
            group=group,
            layer_params=layer_params,
        )
    else:
        prompt_len = batch["prompt_ids"].shape[1]
        ids = jnp.concatenate([batch["prompt_ids"], batch["completion_ids"]], axis=1)
        mask = jnp.concatenate([batch["prompt_mask"], batch["completion_mask"]], axis=1)
        hidden = model(ids, mask, return_hidden=True, layer_params=layer_params)
        hidden = hidden[:, prompt_len - 1 : -1]  # position t predicts token t + 1
    unembed = model.unembed_matrix()
    targets = batch["completion_ids"]
    if chunk_size:
        return chunked_token_logprobs(
            hidden, unembed, targets, chunk_size=chunk_size, temperature=temperature
        )
    # Same numerics as the sampler's logits (unembed_logits), so sampler and
    # trainer log-probs agree in bf16 too.
    logits = unembed_logits(hidden, unembed)
    return (
        token_logprobs(logits, targets, temperature=temperature),
        token_entropy(logits, temperature=temperature),
    )
