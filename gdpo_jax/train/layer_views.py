"""Per-layer weight views for unrolled layers, made once per optimizer update.

A model with ``scan_layers=False`` runs its L layers unrolled, each on its own
slice of the stacked ``[L, ...]`` weights (``Transformer.layer_params``). Sliced
inside the step's micro-batch loop, the M micro-batches of an update each copy
every weight out of its stack and concatenate the L layer gradients back into
an ``[L, ...]`` gradient: 2M copies of the layer weights per update, the
largest cost after the matmuls in SmolLM2-135M's step on XLA:CPU
(docs/benchmarks.md, "At SmolLM2-135M's size"). Here the slices are made once
per update, the loop differentiates with respect to them and accumulates
per-layer gradients, and the L gradients are stacked once at the end: the same
sums, two copies per update instead of 2M. The cost is one more copy of the
layer weights (the views) held for the update.

Under the layer scan (the default) the scan reads the stacked weights in
place, so nothing is split and these helpers are not used.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gdpo_jax.models.layer_weights import split_layers

__all__ = ["LayerViews", "join_grads", "layers_state", "split_params"]

# (params without "layers", per-layer weights {name: f[...]} for each of the L layers)
LayerViews = tuple[nnx.State, tuple[dict[str, jax.Array], ...]]


def split_params(params: nnx.State, num_layers: int) -> LayerViews:
    """nnx.State of the model's params -> (the rest, L per-layer weight dicts).

    The rest keeps the embedding, final norm and (untied) output head as
    nnx.State, so ``nnx.merge(graphdef, rest, layers_state(params))`` rebuilds
    the module, and ``model(..., layer_params=views)`` runs on the views.
    """
    rest = nnx.State({k: v for k, v in params.items() if k != "layers"})
    stacked = params["layers"].to_pure_dict()
    return rest, split_layers(stacked, num_layers)


def layers_state(params: nnx.State) -> nnx.State:
    """The stacked layer weights as a state of their own (to merge with the rest)."""
    return nnx.State({"layers": params["layers"]})


def join_grads(like: nnx.State, grads: LayerViews) -> nnx.State:
    """Gradients with respect to ``split_params``'s output -> gradients shaped like
    `like` (the params): each weight's L per-layer gradients stacked on [L]."""
    rest, layers = grads
    pure = rest.to_pure_dict()
    pure["layers"] = {k: jnp.stack([lp[k] for lp in layers]) for k in layers[0]}
    out = jax.tree.map(lambda x: x, like)
    out.replace_by_pure_dict(pure)
    return out
