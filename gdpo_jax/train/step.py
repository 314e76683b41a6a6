"""The fused, sharded RL step: rewards -> advantages -> log-probs -> loss -> update.

One `jax.jit` for the whole rollout batch: GDPO/GRPO advantages from raw
rewards f32[N, K] and group ids (segment sums, never back on the host), then
`num_epochs x num_minibatches` optimizer updates, each accumulating gradients
over `num_microbatches` micro-batches with a `lax.scan`. The loss is a
(sum, denominator) pair, so the accumulated gradient is exactly the gradient
of the whole mini-batch's loss: grad(sum_1 + ... + sum_M) / (den_1 + ... + den_M).

Row layout: `train/blocks.py` (mini-batches of whole prompt groups where the
mesh allows, every device keeping its own rows). With `StepConfig.share_prompt`
each micro-batch runs each of its prompts once (`models.prompt_sharing`); the
layout is the same with it or without.

Batch (global arrays, leading dim N = num_prompts * group_size):
  prompt_ids i32[N,P] (left padded), prompt_mask i32[N,P],
  completion_ids i32[N,C], completion_mask i32[N,C],
  old_logp f32[N,C] (tempered log-probs of the policy that sampled),
  ref_logp f32[N,C] (only when beta > 0 or kl_in_reward > 0, and not
    `StepConfig.ref_logp_in_step`: then the step takes the reference params
    and runs their forward in each micro-batch),
  rewards f32[N,K] (NaN = unscorable), group_ids i32[N], valid bool[N].
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from gdpo_jax.core.advantages import compute_advantages, rewards_as_read
from gdpo_jax.core.losses import policy_loss, sequence_kl
from gdpo_jax.train import layer_views
from gdpo_jax.train import mesh as mesh_lib
from gdpo_jax.train.blocks import from_blocks, to_blocks
from gdpo_jax.train.completion import completion_logprobs
from gdpo_jax.train.state import TrainState, finite_update, keep_update
from gdpo_jax.train.step_config import (
    BATCH_KEYS,
    Batch,
    StepConfig,
    old_logp_in_step,
    ref_logp_in_step,
)
from gdpo_jax.train.step_metrics import combine_pairs, step_metrics

__all__ = [
    "BATCH_KEYS",
    "Batch",
    "CompiledStep",
    "StepConfig",
    "completion_logprobs",
    "logprob_fn",
    "old_logp_in_step",
    "ref_logp_in_step",
    "sequence_kl",
    "train_step",
]


def _logprobs(model: Any, mb: Batch, cfg: StepConfig, views: Any) -> tuple[jax.Array, jax.Array]:
    """`completion_logprobs` of one micro-batch with the step's settings:
    (log-probs f32[n, C], entropy f32[n, C]); `views`: unrolled layers' weights."""
    return completion_logprobs(
        model,
        mb,
        temperature=cfg.temperature,
        chunk_size=cfg.logprob_chunk_size,
        group=cfg.shared_group,
        layer_params=views,
    )


# --------------------------------------------------------------------------- #
# The step.
# --------------------------------------------------------------------------- #
def train_step(
    state: TrainState,
    batch: Batch,
    ref_params: Any = None,
    *,
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    cfg: StepConfig,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """All optimizer updates of one rollout batch. Returns (new state, scalar metrics).

    `ref_params` (the reference policy's params, placed like `state.params`) is
    read only with `cfg.ref_logp_in_step`: each micro-batch then computes its
    reference log-probs f32[n, C] before its policy forward, in this program.
    """
    mask = batch["completion_mask"].astype(jnp.float32) * batch["valid"][:, None]
    rewards = batch["rewards"].astype(jnp.float32)
    weights = None if cfg.weights is None else jnp.asarray(cfg.weights, jnp.float32)
    penalty = seq_kl = None
    if cfg.kl_in_reward > 0:
        # -coef * sum_t (logp_old - logp_ref): a per-row penalty, not a reward column
        # (GDPO would normalize a column into an objective of its own); see
        # compute_advantages for where each estimator adds it.
        seq_kl = sequence_kl(batch["old_logp"], batch["ref_logp"], mask, cfg.kl_in_reward_estimator)
        penalty = -cfg.kl_in_reward * seq_kl
    adv = compute_advantages(
        rewards,
        batch["group_ids"],
        num_groups=cfg.num_groups,
        estimator=cfg.estimator,
        weights=weights,
        valid=batch["valid"],
        eps=cfg.eps,
        batch_norm=cfg.batch_norm,
        token_counts=jnp.sum(mask, axis=-1).astype(jnp.int32),
        penalty=penalty,
        nan_rewards=cfg.nan_rewards,
    )

    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
    data = {k: batch[k] for k in keys + (() if cfg.old_logp_in_step else ("old_logp",))}
    data["loss_mask"], data["adv"], data["valid"] = mask, adv, batch["valid"]
    use_ref = cfg.beta > 0
    if use_ref and not cfg.ref_logp_in_step:
        data["ref_logp"] = batch["ref_logp"]
    U, M = cfg.num_minibatches, cfg.num_microbatches
    units = cfg.layout_units(batch["prompt_ids"].shape[0])
    blocks = jax.tree.map(lambda x: to_blocks(x, U, M, units), data)

    # Unrolled layers: per-layer weight views made once per update, not once per
    # micro-batch (train/layer_views.py); the layer scan reads the stacks in place.
    model_cfg = nnx.merge(graphdef, state.params).cfg
    unrolled = not model_cfg.scan_layers

    def micro_loss(diff, mb, stacked):
        # diff: what is differentiated (params, or layer_views.split_params' views).
        if unrolled:
            views, model = diff[1], nnx.merge(graphdef, diff[0], stacked)
        else:
            views, model = None, nnx.merge(graphdef, diff)
        logp, ent = _logprobs(model, mb, cfg, views)
        if cfg.entropy_coef == 0:
            ent = jax.lax.stop_gradient(ent)  # metric only
        # One update per batch: the pre-update policy is these very params.
        old = jax.lax.stop_gradient(logp) if cfg.old_logp_in_step else mb["old_logp"]
        loss_sum, denom, metrics = policy_loss(
            logp,
            old,
            mb["adv"],
            mb["loss_mask"],
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            dual_clip=cfg.dual_clip,
            ref_logp=mb["ref_logp"] if use_ref else None,
            beta=cfg.beta,
            kl_estimator=cfg.kl_estimator,
            entropy=ent,
            entropy_coef=cfg.entropy_coef,
            aggregation=cfg.aggregation,
            max_len=cfg.max_len,
            row_valid=mb["valid"],
        )
        return loss_sum, (denom, metrics)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    if cfg.ref_logp_in_step:
        # The reference forward of each micro-batch, in this program (one update
        # per batch, so it runs once per row as a separate pass would).
        ref_model = nnx.merge(graphdef, ref_params)
        ref_views = None if model_cfg.scan_layers else ref_model.layer_params()

    def with_ref_logp(mb: Batch) -> Batch:
        if not cfg.ref_logp_in_step:
            return mb
        ref_logp = _logprobs(ref_model, mb, cfg, ref_views)[0]
        return dict(mb, ref_logp=jax.lax.stop_gradient(ref_logp))

    def update(carry, mini):
        params, opt_state = carry
        diff = layer_views.split_params(params, model_cfg.num_layers) if unrolled else params
        stacked = layer_views.layers_state(params) if unrolled else None

        def micro(acc, mb):
            mb = with_ref_logp(mb)
            (loss_sum, (denom, metrics)), grads = grad_fn(diff, mb, stacked)
            g_acc, l_acc, d_acc, m_acc = acc
            g_acc = jax.tree.map(lambda a, x: a + x.astype(a.dtype), g_acc, grads)
            m_acc = combine_pairs(m_acc, metrics)
            return (g_acc, l_acc + loss_sum, d_acc + denom, m_acc), None

        # Accumulators start at the identity of each reduction, so every
        # micro-batch runs through the one scanned body (compiled once).
        shapes = jax.eval_shape(
            lambda d, mb, st: grad_fn(d, with_ref_logp(mb), st),
            diff,
            jax.tree.map(lambda x: x[0], mini),
            stacked,
        )
        (_, (_, m_shape)), _ = shapes
        m0 = {
            k: (
                jnp.full(
                    (),
                    jnp.inf if k.endswith("_min") else -jnp.inf if k.endswith("_max") else 0.0,
                    jnp.float32,
                ),
                jnp.zeros((), jnp.float32),
            )
            for k in m_shape
        }
        # Summed in f32 whatever the parameters' dtype: bf16 sums of several micro-batches
        # lose the small ones, and the scan's carry must keep one dtype. zeros_like keeps
        # each gradient's sharding, which explicit meshes carry in its type.
        g0 = jax.tree.map(
            lambda x: jnp.zeros_like(x, jnp.promote_types(x.dtype, jnp.float32)), diff
        )
        zero = jnp.zeros((), jnp.float32)
        (g, loss_tot, d, m), _ = jax.lax.scan(micro, (g0, zero, zero, m0), mini)
        # Denominators depend only on masks, so dividing the summed gradient
        # by the summed denominator is the exact mini-batch gradient.
        scale = 1.0 / jnp.maximum(d, 1e-12)
        g = layer_views.join_grads(params, g) if unrolled else g
        # Back to each parameter's dtype, so the optimizer state keeps it (bf16 parameters
        # with f32 gradients gave f32 Adam moments: the update scan's carry changed type).
        grads = jax.tree.map(lambda x, p: (x * scale).astype(p.dtype), g, params)
        grad_norm = optax.global_norm(grads)
        updates, new_opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        # Not applied when not finite; the loop stops the run on it (`nonfinite_updates`).
        finite = finite_update(grad_norm, new_params)
        # A mini-batch without a token (only dynamic sampling's padding groups) has
        # no loss: no update either (AdamW would still move the weights by its
        # momentum and weight decay). Elementwise, so it fuses into the update.
        had_tokens = d > 0
        keep = had_tokens & finite
        params = jax.tree.map(lambda new, old: jnp.where(keep, new, old), new_params, params)
        opt_state = keep_update(keep, new_opt_state, opt_state)
        nonfinite = had_tokens & ~finite
        return (params, opt_state), (m, loss_tot * scale, grad_norm, had_tokens, nonfinite)

    def epoch(carry, _):
        return jax.lax.scan(update, carry, blocks)

    (params, opt_state), (m, losses, grad_norms, kept, nonfinite) = jax.lax.scan(
        epoch, (state.params, state.opt_state), None, length=cfg.num_epochs
    )
    metrics = step_metrics(
        m,
        losses,
        grad_norms,
        kept,
        adv=adv,
        rewards=rewards_as_read(rewards, estimator=cfg.estimator, nan_rewards=cfg.nan_rewards),
        batch=batch,
        cfg=cfg,
        lr=schedule(state.step * cfg.updates_per_step),
        seq_kl=seq_kl,
    )
    metrics["nonfinite_updates"] = jnp.sum(nonfinite).astype(jnp.float32)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics


def logprob_fn(params: Any, batch: Batch, *, graphdef: nnx.GraphDef, cfg: StepConfig) -> jax.Array:
    """Completion log-probs f32[N,C] of `params` (reference or pre-update policy).

    Run micro-batch by micro-batch (same layout as the step) to bound memory.
    """
    U, M = cfg.num_minibatches, cfg.num_microbatches
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
    units = cfg.layout_units(batch["prompt_ids"].shape[0])
    blocks = {k: to_blocks(batch[k], U, M, units) for k in keys}
    model = nnx.merge(graphdef, params)
    # Unrolled layers: slice the weights once for all blocks.
    views = None if model.cfg.scan_layers else model.layer_params()

    def one(mb):
        return _logprobs(model, mb, cfg, views)[0]

    flat = {k: v.reshape(U * M, *v.shape[2:]) for k, v in blocks.items()}
    out = jax.lax.map(one, flat)
    return from_blocks(out.reshape(U, M, *out.shape[1:]), units)


class CompiledStep:
    """`train_step` and `logprob_fn` jitted with explicit shardings for one mesh.

    Call `step(state, batch, ref_params)` (`ref_params` read only with
    `cfg.ref_logp_in_step`); `logprobs(params, batch)`. `compile_count()`
    reports how many times the step has been compiled (once per prompt width;
    tests assert it).
    """

    def __init__(
        self,
        *,
        graphdef: nnx.GraphDef,
        tx: optax.GradientTransformation,
        schedule: optax.Schedule,
        cfg: StepConfig,
        state_shardings: Any = None,
        mesh: Mesh | None = None,
        batch_keys: tuple[str, ...] | None = None,
    ):
        self.cfg, self.mesh = cfg, mesh
        if cfg.old_logp_in_step and (cfg.kl_in_reward > 0 or cfg.updates_per_step != 1):
            raise ValueError(
                f"StepConfig(old_logp_in_step=True) needs updates_per_step == 1 (got "
                f"{cfg.updates_per_step}) and kl_in_reward == 0 (got {cfg.kl_in_reward}): "
                "otherwise the old log-probs must be computed before the update."
            )
        shards = mesh_lib.batch_axis_size(mesh)
        rows = cfg.num_groups * cfg.group_size
        if cfg.batch_shards != shards and cfg.layout_units(rows) != dataclasses.replace(
            cfg, batch_shards=shards, share_prompt=False
        ).layout_units(rows):
            raise ValueError(
                f"StepConfig was built for {cfg.batch_shards} batch shard(s), the mesh has "
                f"{shards}, and the batch layout differs between them; build it with "
                "StepConfig.from_config(cfg, batch_shards=sharding.batch_axis_size(mesh))."
            )
        if cfg.ref_logp_in_step and (cfg.kl_in_reward > 0 or cfg.updates_per_step != 1):
            raise ValueError(
                f"StepConfig(ref_logp_in_step=True) needs updates_per_step == 1 (got "
                f"{cfg.updates_per_step}) and kl_in_reward == 0 (got {cfg.kl_in_reward}): "
                "otherwise the reference log-probs must be computed before the update."
            )
        base = tuple(k for k in BATCH_KEYS if not (cfg.old_logp_in_step and k == "old_logp"))
        batch_ref = cfg.needs_ref and not cfg.ref_logp_in_step
        keys = tuple(batch_keys or base + (("ref_logp",) if batch_ref else ()))
        self.batch_keys = keys
        step = functools.partial(train_step, graphdef=graphdef, tx=tx, schedule=schedule, cfg=cfg)
        lp = functools.partial(logprob_fn, graphdef=graphdef, cfg=cfg)
        if mesh is None:
            self._step = jax.jit(step, donate_argnums=(0,))
            self._logprobs = jax.jit(lp)
            return
        ref_sh = state_shardings.params if cfg.ref_logp_in_step else None
        ndim = {"rewards": 2, "group_ids": 1, "valid": 1}
        batch_sh = {k: mesh_lib.batch_sharding(mesh, ndim.get(k, 2)) for k in keys}
        rep = NamedSharding(mesh, P())
        self._step = jax.jit(
            step,
            in_shardings=(state_shardings, batch_sh, ref_sh),
            out_shardings=(state_shardings, rep),
            donate_argnums=(0,),
        )
        lp_keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
        self._logprobs = jax.jit(
            lambda params, b: lp(params, b),
            in_shardings=(state_shardings.params, {k: batch_sh[k] for k in lp_keys}),
            out_shardings=mesh_lib.batch_sharding(mesh, 2),
        )
        self._lp_keys = lp_keys

    def _ctx(self):
        import contextlib

        return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    def __call__(
        self, state: TrainState, batch: Batch, ref_params: Any = None
    ) -> tuple[TrainState, dict]:
        """One step. `ref_params`: the reference policy, read only when
        `cfg.ref_logp_in_step` (else the batch carries "ref_logp")."""
        ref_params = self._ref(ref_params)
        batch = {k: batch[k] for k in self.batch_keys}
        with self._ctx():
            return self._step(state, batch, ref_params)

    def _ref(self, ref_params: Any) -> Any:
        if not self.cfg.ref_logp_in_step:
            return None
        if ref_params is None:
            raise ValueError(
                "StepConfig(ref_logp_in_step=True) computes the reference log-probs in "
                "the step: pass the reference params, step(state, batch, ref_params)."
            )
        return ref_params

    def logprobs(self, params: Any, batch: Batch) -> jax.Array:
        keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
        with self._ctx():
            return self._logprobs(params, {k: batch[k] for k in keys})

    def compile_count(self) -> int:
        return self._step._cache_size()

    def lower(self, state: TrainState, batch: Batch, ref_params: Any = None):
        ref_params = self._ref(ref_params)
        batch = {k: batch[k] for k in self.batch_keys}
        with self._ctx():
            return self._step.lower(state, batch, ref_params)

    # The batch arrays the log-prob pass reads (its arguments besides the params).
    LOGPROB_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")

    def lower_logprobs(self, params: Any, batch: Batch):
        """The log-prob pass lowered for `params` / `batch` (arrays or ShapeDtypeStructs)."""
        with self._ctx():
            return self._logprobs.lower(params, {k: batch[k] for k in self.LOGPROB_KEYS})
