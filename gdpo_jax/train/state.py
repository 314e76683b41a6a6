"""Train state (params + optimizer state + step), born sharded, and the optimizer.

The policy is an NNX module; the step is a pure function of
`(TrainState, batch[, ref_params])`, so the module is split once into a static `graphdef`
(bound into the step with `partial`) and an `nnx.State` of parameters.
"""

from __future__ import annotations

import logging
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from gdpo_jax.train.config import DECAY_MASKS

log = logging.getLogger("gdpo_jax.train")


@flax.struct.dataclass
class TrainState:
    """step: i32[] RL steps done; params: nnx.State of nnx.Param; opt_state: optax state."""

    step: jax.Array
    params: Any
    opt_state: Any


def make_schedule(
    *, lr: float, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0
) -> optax.Schedule:
    """Linear warmup from 0, then constant / cosine / linear decay to lr * min_lr_ratio.

    Counts are optimizer updates.
    """
    warmup_steps = max(int(warmup_steps), 0)
    decay_steps = max(int(total_steps) - warmup_steps, 1)
    end = lr * min_lr_ratio
    if schedule == "constant":
        after = optax.constant_schedule(lr)
    elif schedule == "cosine":
        after = optax.cosine_decay_schedule(lr, decay_steps, alpha=min_lr_ratio)
    elif schedule == "linear":
        after = optax.linear_schedule(lr, end, decay_steps)
    else:
        raise ValueError(f"optim.schedule={schedule!r}; use cosine, constant or linear.")
    if not warmup_steps:
        return after
    return optax.join_schedules(
        [optax.linear_schedule(0.0, lr, warmup_steps), after], [warmup_steps]
    )


# optim.decay_mask (DECAY_MASKS): which parameters AdamW's weight decay shrinks.
#   all: every parameter (verl's actor optimizer, the paper configs' choice);
#   no_bias_norm: matrices and embeddings only, as Hugging Face's Trainer (TRL) does:
#     biases and norm weights are left undecayed.


def _decayed(path: tuple) -> bool:
    """Whether the parameter at `path` (a key path into an nnx.State) is decayed under
    no_bias_norm: its name, the last dict key (`q_bias`, `attn_norm`, `final_norm`),
    ends in neither `bias` nor `norm`. Names, not ranks: stacked layers make a norm
    weight 2-D."""
    names = [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]
    name = names[-1] if names else ""
    return not (name.endswith("bias") or name.endswith("norm"))


def decay_mask(rule: str) -> Any:
    """optax.adamw's `mask` for `optim.decay_mask=rule`: None (decay everything) or a
    function of the params giving a bool per leaf."""
    if rule == "all":
        return None
    if rule == "no_bias_norm":
        return lambda params: jax.tree_util.tree_map_with_path(
            lambda path, _: _decayed(path), params
        )
    raise ValueError(f"optim.decay_mask={rule!r}; use one of {', '.join(DECAY_MASKS)}.")


def make_optimizer(
    optim, *, total_updates: int, updates_per_step: int = 1
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW with global-norm clipping from `config.optim`.

    `optim.warmup_steps` is in RL steps (each makes `updates_per_step` updates).
    """
    schedule = make_schedule(
        lr=optim.lr,
        schedule=optim.schedule,
        warmup_steps=optim.warmup_steps * updates_per_step,
        total_steps=total_updates,
        min_lr_ratio=optim.min_lr_ratio,
    )
    steps = total_updates // max(updates_per_step, 1)
    if optim.warmup_steps and optim.warmup_steps >= steps:
        # Legal (a short smoke run of a long config), but a run of that length never
        # trains at the learning rate it names: say so.
        log.warning(
            "optim.warmup_steps=%d is not below the run's %d steps: the learning rate never "
            "reaches optim.lr=%g (its last update uses %.3g)",
            optim.warmup_steps,
            steps,
            optim.lr,
            float(schedule(max(total_updates - 1, 0))),
        )
    parts = []
    if optim.max_grad_norm and optim.max_grad_norm > 0:
        parts.append(optax.clip_by_global_norm(optim.max_grad_norm))
    parts.append(
        optax.adamw(
            schedule,
            b1=optim.b1,
            b2=optim.b2,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
            mask=decay_mask(optim.get("decay_mask", "all")),
        )
    )
    return optax.chain(*parts), schedule


def rl_optimizer(
    cfg: Any, updates_per_step: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """`make_optimizer` for an RL run of `cfg`: cfg.train.num_steps RL steps of
    `updates_per_step` updates each (StepConfig.updates_per_step)."""
    return make_optimizer(
        cfg.optim,
        total_updates=cfg.train.num_steps * updates_per_step,
        updates_per_step=updates_per_step,
    )


def create_train_state(
    model: nnx.Module, tx: optax.GradientTransformation, mesh: Mesh | None = None
) -> tuple[nnx.GraphDef, TrainState]:
    """Splits a (sharded) model and initializes the optimizer next to its params.

    The optimizer state is made by a jitted `tx.init`, so each moment is placed
    like its parameter from the start and the step compiles once.
    """
    graphdef, params = nnx.split(model, nnx.Param)
    init = jax.jit(tx.init)
    if mesh is not None:
        with jax.set_mesh(mesh):
            opt_state = init(params)
        step = jax.device_put(jnp.zeros((), jnp.int32), NamedSharding(mesh, jax.P()))
    else:
        opt_state = init(params)
        step = jnp.zeros((), jnp.int32)
    return graphdef, TrainState(step=step, params=params, opt_state=opt_state)


def shardings_of(tree: Any) -> Any:
    """The sharding of each array leaf of `tree` (for jit in/out_shardings)."""
    return jax.tree.map(lambda x: x.sharding, tree)


def abstract_of(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) of `tree`, e.g. an orbax restore target."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def num_params(params: Any) -> int:
    return int(sum(x.size for x in jax.tree.leaves(params)))


def keep_update(keep: jax.Array, new: Any, old: Any) -> Any:
    """The optimizer state after an update, or before it where `keep` is False (a
    mini-batch without a token), except the learning-rate schedule's count, which
    advances either way: it is the update's place in the run (update i of RL step s
    runs at schedule(s * updates_per_step + i), the logged lr at i = 0; HF's
    scheduler steps once per optimizer update too, verl's once per RL step). Restored
    with the rest, each skipped update left warmup and decay one update late for the
    rest of the run, and the logged lr was not the applied one."""
    is_sched = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
    return jax.tree.map(
        lambda n, o: n if is_sched(n) else jax.tree.map(lambda a, b: jnp.where(keep, a, b), n, o),
        new,
        old,
        is_leaf=is_sched,
    )


def finite_update(grad_norm: jax.Array, new_params: Any) -> jax.Array:
    """bool[]: whether an update may be applied: its gradient norm and every updated
    weight finite (checked element by element: a norm of huge finite weights overflows).
    A non-finite one (an overflow, a diverged learning rate) left NaN weights that were
    sampled from and checkpointed; callers keep the old weights and stop the run
    (`errors.NonFiniteUpdateError`)."""
    ok = jnp.isfinite(grad_norm)
    for x in jax.tree.leaves(new_params):
        ok &= jnp.all(jnp.isfinite(x))
    return ok
