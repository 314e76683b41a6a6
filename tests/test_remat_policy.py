"""model.remat_policy: what a rematerialized layer keeps for its backward.

"full" keeps the layer's inputs (the backward re-runs the whole layer), "dots"
also its weight products' outputs (the backward re-runs norms, RoPE, attention
and gating, not the products). Both give autodiff's gradients; what each keeps
is read from JAX's own account of the residuals (`print_saved_residuals`), and what
each re-runs from the compiled program's FLOP count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals

from gdpo_jax.models import ModelConfig
from gdpo_jax.models.prompt_sharing import shared_prompt_hidden
from tests.test_models import _batch, _random_model

# (remat, remat_policy): no remat, then each policy.
FORMS = ((False, "full"), (True, "full"), (True, "dots"))


def _models(scan_layers: bool = True, **kw) -> dict[tuple[bool, str], object]:
    """The same random weights under each form."""
    base = ModelConfig.tiny(num_layers=3, scan_layers=scan_layers, **kw)
    ref = _random_model(base)
    out = {}
    for remat, policy in FORMS:
        cfg = dataclasses.replace(base, remat=remat, remat_policy=policy)
        m = _random_model(cfg)
        nnx.update(m, nnx.state(ref))
        out[remat, policy] = m
    return out


def _loss(model, ids, mask):
    logits = model(ids, mask)
    w = jnp.sin(jnp.arange(logits.shape[-1], dtype=jnp.float32))  # not a plain sum
    return jnp.sum(logits * w * mask[..., None])


def _close(got: np.ndarray, want: np.ndarray, form) -> None:
    """Equal up to f32 sums in another order: 1e-5 of the gradient's own scale."""
    err = float(np.abs(got - want).max())
    assert err <= 1e-5 * float(np.abs(want).max()) + 1e-7, (form, err)


def _grads(model, ids, mask) -> list[np.ndarray]:
    g = jax.jit(nnx.grad(_loss))(model, ids, mask)
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(g))]


@pytest.mark.parametrize("scan_layers", [True, False], ids=["scan", "unrolled"])
def test_every_policy_gives_autodiffs_gradients(scan_layers):
    ids, mask = _batch()
    models = _models(scan_layers)
    want = _grads(models[False, "full"], ids, mask)
    for form in FORMS[1:]:
        got = _grads(models[form], ids, mask)
        for g, w in zip(got, want, strict=True):
            _close(g, w, form)
    assert max(float(np.abs(w).max()) for w in want) > 0


def test_the_shared_prompt_loop_gives_the_same_gradients_under_dots():
    """The one-loop shared-prompt forward (prompts and rows in one scan) under each
    policy: the same gradients as without remat."""
    rs = np.random.RandomState(3)
    G, P, C = 2, 5, 4
    pid = jnp.asarray(np.repeat(rs.randint(3, 256, (2, P)), G, axis=0), jnp.int32)
    pmask = jnp.ones_like(pid).at[:, :2].set(0)  # left padded
    cid = jnp.asarray(rs.randint(3, 256, (2 * G, C)), jnp.int32)
    cmask = jnp.ones_like(cid).at[1, 2:].set(0)  # right padded

    def loss(m):
        h = shared_prompt_hidden(m, pid, pmask, cid, cmask, group=G)
        return jnp.sum(jnp.sin(h) * cmask[..., None])

    models = _models(True)
    grads = {}
    for form, m in models.items():
        g = jax.jit(nnx.grad(loss))(m)
        grads[form] = [np.asarray(x) for x in jax.tree.leaves(nnx.state(g))]
    for form in FORMS[1:]:
        for g, w in zip(grads[form], grads[False, "full"], strict=True):
            _close(g, w, form)


def _stacked_residuals(model, ids, mask) -> list[int]:
    """The minor widths of the [L, B, T, .] residuals the layer scan stacks for the
    backward, from JAX's own account of what it saves (`print_saved_residuals`)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # one line per residual
        print_saved_residuals(lambda m: _loss(m, ids, mask), model)
    (B, T), L = ids.shape, model.cfg.num_layers
    stacked = re.findall(rf"f32\[{L},{B},{T},(\d+)\] output of scan", out.getvalue())
    return sorted(int(w) for w in stacked)


def test_dots_keeps_the_weight_products_and_full_keeps_the_inputs():
    """What each policy stacks over the layers: "full" the layers' inputs alone
    ([L, B, T, d]), "dots" also the weight products' outputs that the backward
    reads (q, k, v, o, gate, up by their widths, reached through core.dense's
    custom VJP on CPU; not the down projection's, which only a residual add reads,
    whose gradient needs no operand), no remat those and more (the attention
    probabilities, the norms)."""
    ids, mask = _batch()
    models = _models(True)
    c = models[True, "full"].cfg
    d, f = c.hidden_size, c.intermediate_size
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    assert _stacked_residuals(models[True, "full"], ids, mask) == [d]
    products = [q, kv, kv, d, f, f]  # q, k, v, o, gate, up
    assert _stacked_residuals(models[True, "dots"], ids, mask) == sorted([d, *products])
    assert len(_stacked_residuals(models[False, "full"], ids, mask)) > 7


def _compiled(model, ids, mask):
    return jax.jit(nnx.grad(_loss)).lower(model, ids, mask).compile()


def test_what_each_policy_re_runs_and_holds_in_the_compiled_step():
    """XLA's FLOP count of the compiled gradient under the layer scan (it counts a
    loop's body once: one layer's worth). "full" re-runs the layer's weight products,
    all but the down projection, whose output no backward rule reads (DCE'd), and its
    attention dots; "dots" only the attention dots (and the elementwise work around
    them). Hand-worked from the tiny shapes, per token: 2 d (q + 2 kv) + 2 q d + 4 d f
    for the products re-run, 4 q T for the attention dots. The temporaries order the
    other way: no remat > dots > full."""
    B, T = 4, 8
    ids, mask = _batch(B, T)
    models = _models(True)
    c = models[False, "full"].cfg
    d, f = c.hidden_size, c.intermediate_size
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    products = B * T * (2 * d * (q + 2 * kv) + 2 * q * d + 4 * d * f)
    attention = B * 4 * q * T * T  # QK^T and PV over all T x T cells (masked, not skipped)
    none, full, dots = (_compiled(models[form], ids, mask) for form in FORMS)
    flops = [x.cost_analysis()["flops"] for x in (none, full, dots)]
    # Elementwise work (norms, softmax, RoPE) is in XLA's count too.
    assert flops[1] - flops[0] == pytest.approx(products + attention, rel=0.1)
    assert attention <= flops[2] - flops[0] < 0.1 * (flops[1] - flops[0])
    temp = [x.memory_analysis().temp_size_in_bytes for x in (none, full, dots)]
    assert temp[0] > temp[2] > temp[1]
