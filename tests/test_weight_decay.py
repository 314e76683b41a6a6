"""`optim.decay_mask`: which parameters AdamW's weight decay shrinks. `no_bias_norm`
decays what Hugging Face's Trainer (so TRL) decays, computed by transformers itself;
`all` (verl's choice) decays everything."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gdpo_jax.errors import ConfigError
from gdpo_jax.models import ModelConfig
from gdpo_jax.models.hf_names import LAYER_NAMES, TOP_NAMES
from gdpo_jax.models.transformer import Transformer
from gdpo_jax.train import state as state_lib
from gdpo_jax.train.config import validate_config
from gdpo_jax.train.schema import base_config

# (our model_type, transformers' config class): q/k/v biases (qwen2), q/k norms (qwen3).
ARCHS = [("qwen2", "Qwen2Config"), ("qwen3", "Qwen3Config"), ("llama", "LlamaConfig")]


def _params(model_type: str):
    """Our params, every leaf random and nonzero (biases start at 0: a halved 0 is 0)."""
    model = Transformer(ModelConfig.tiny(model_type=model_type), rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    return jax.tree.unflatten(
        tree, [1.0 + jax.random.uniform(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
    )


def _one_update(params, decay_mask: str):
    """One AdamW update with zero gradients (Adam's step is then 0), lr 1, decay 0.5:
    a decayed parameter halves, another stays."""
    optim = base_config().optim
    optim.update(dict(lr=1.0, weight_decay=0.5, max_grad_norm=0.0, decay_mask=decay_mask))
    tx, _ = state_lib.make_optimizer(optim, total_updates=4)
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params)
    return jax.tree.map(lambda p, u: p + u, params, updates)


def _decayed_names(params, decay_mask: str) -> set[str]:
    new = _one_update(params, decay_mask)
    out = set()
    for (path, old), upd in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(new), strict=True
    ):
        name = [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)][-1]
        old, upd = np.asarray(old), np.asarray(upd)
        if np.allclose(upd, 0.5 * old, rtol=1e-6):
            out.add(name)
        else:  # not decayed: untouched, bit for bit
            np.testing.assert_array_equal(upd, old, err_msg=name)
    return out


@pytest.mark.parametrize("model_type, _", ARCHS)
def test_all_decays_every_parameter(model_type, _):
    params = _params(model_type)
    names = {
        [str(k.key) for k in p if isinstance(k, jax.tree_util.DictKey)][-1]
        for p, _ in jax.tree_util.tree_leaves_with_path(params)
    }
    assert _decayed_names(params, "all") == names


@pytest.mark.parametrize("model_type, hf_config", ARCHS)
def test_no_bias_norm_decays_what_the_hf_trainer_decays(model_type, hf_config):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = ModelConfig.tiny(model_type=model_type)
    hf = transformers.AutoModelForCausalLM.from_config(
        getattr(transformers, hf_config)(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=1,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_kv_heads,
            tie_word_embeddings=False,
        )
    )
    hf_decayed = set(transformers.Trainer.get_decay_parameter_names(None, hf))
    ours = _decayed_names(_params(model_type), "no_bias_norm")
    # Our names -> HF's (layer 0), the ones this architecture has.
    hf_of = {k: v[0].format(i=0) for k, v in {**TOP_NAMES, **LAYER_NAMES}.items()}
    hf_params = dict(hf.named_parameters())
    mapped = {hf_of[n] for n in ours}
    assert mapped == hf_decayed & set(hf_of.values())
    assert any(n.endswith("bias") or "norm" in n for n in hf_params), "nothing to leave out"
    assert mapped < set(hf_params)


def test_an_unknown_decay_mask_is_refused_naming_the_choices():
    cfg = base_config()
    cfg.workdir = "/tmp/x"
    cfg.optim.decay_mask = "biases"
    with pytest.raises(ConfigError, match=r"optim\.decay_mask.*no_bias_norm"):
        validate_config(cfg)
