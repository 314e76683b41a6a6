"""SFT's batch layout (left-padded prompts, right-padded targets) and its step: the mean
completion-token negative log-likelihood, one optimizer update."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from gdpo_jax.train import state as state_lib
from gdpo_jax.train.completion import completion_logprobs

__all__ = ["Batch", "encode_batch", "sft_loss", "sft_step"]

Batch = dict[str, jax.Array]


def encode_batch(
    prompt_ids: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    *,
    max_prompt_len: int,
    max_target_len: int,
    pad_id: int,
) -> dict[str, np.ndarray]:
    """Token lists -> RL-layout arrays: prompt_ids/prompt_mask i32[B, P] (left padded),
    completion_ids/completion_mask i32[B, C] (right padded). Raises on overflow."""
    b = len(prompt_ids)
    out = {
        "prompt_ids": np.full((b, max_prompt_len), pad_id, np.int32),
        "prompt_mask": np.zeros((b, max_prompt_len), np.int32),
        "completion_ids": np.full((b, max_target_len), pad_id, np.int32),
        "completion_mask": np.zeros((b, max_target_len), np.int32),
    }
    for i, (p, t) in enumerate(zip(prompt_ids, targets)):
        if len(p) > max_prompt_len or len(t) > max_target_len:
            raise ValueError(
                f"row {i}: prompt {len(p)} / target {len(t)} tokens exceed "
                f"sampling.max_prompt_len={max_prompt_len} / "
                f"max_new_tokens={max_target_len}."
            )
        out["prompt_ids"][i, max_prompt_len - len(p) :] = p
        out["prompt_mask"][i, max_prompt_len - len(p) :] = 1
        out["completion_ids"][i, : len(t)] = t
        out["completion_mask"][i, : len(t)] = 1
    return out


def sft_loss(params: Any, batch: Batch, *, graphdef: nnx.GraphDef) -> tuple[jax.Array, jax.Array]:
    """Mean -log p over completion tokens. Returns (loss f32[], token count f32[])."""
    model = nnx.merge(graphdef, params)
    logp, _ = completion_logprobs(model, batch)
    mask = batch["completion_mask"].astype(jnp.float32)
    n = jnp.sum(mask)
    return -jnp.sum(logp * mask) / jnp.maximum(n, 1.0), n


def sft_step(
    state: state_lib.TrainState,
    batch: Batch,
    *,
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
) -> tuple[state_lib.TrainState, dict[str, jax.Array]]:
    (loss, n), grads = jax.value_and_grad(
        functools.partial(sft_loss, graphdef=graphdef), has_aux=True
    )(state.params, batch)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.global_norm(grads)
    ok = state_lib.finite_update(grad_norm, params)  # else kept as it was; the run stops
    params = jax.tree.map(lambda new, old: jnp.where(ok, new, old), params, state.params)
    opt_state = state_lib.keep_update(ok, opt_state, state.opt_state)
    metrics = {
        "loss": loss,
        "tokens": n,
        "grad_norm": grad_norm,
        "lr": jnp.asarray(schedule(state.step), jnp.float32),
        "nonfinite_updates": (~ok).astype(jnp.float32),
    }
    return state_lib.TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics
