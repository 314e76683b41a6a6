"""Shared pieces of the paper's configs (configs/paper_{toolcall,math,code}.py).

The GDPO paper (arXiv 2601.05242) ran its experiments with verl; the configs
translate verl's settings into ours. Conventions used by all three:

* verl's `data.train_batch_size` and `ppo_mini_batch_size` count *prompts*;
  every prompt gets `rollout.n` = G responses. So "batch 512, mini-batch 128,
  G = 4" is `algo.num_prompts=512` (2048 response rows per RL step) and
  `algo.num_minibatches = 512 / 128 = 4` optimizer updates per step.
* verl recomputes the old log-probs with the training forward (not vLLM's):
  `algo.old_logprobs="recompute"`.
* verl's GRPO/GDPO patch: eps 1e-6 and token-weighted batch whitening
  (`algo.batch_norm="token"`); pass `--config.algo.batch_norm=sample
  --config.algo.eps=1e-4` for the TRL-patch semantics.
* verl's loss_agg_mode "token-mean" is our `algo.aggregation="dapo"`.
* Weights stay float32 (master copy; AdamW at lr 1e-6 moves a weight by
  ~1e-6, far below bf16's spacing of ~1e-4 at |w| ~ 0.02, so bf16-stored
  weights would not train), compute is bfloat16, layers are rematerialized
  (`model.remat_policy="full"`; `dots` has the lower training roofline and
  fits every target of docs/scale.md's plan table but the v5e-16: its remat
  sweep), log-probs are chunked over the sequence (no [B, T, 152k] logits).
* The mesh puts every device on "fsdp" (ZeRO-3 style, like verl's FSDP):
  `mesh.shape=(1, -1, 1)`. `algo.num_microbatches` is set for 8 devices at the
  given rows per device; on N devices use `per_update_rows / (rows_per_device * N)`.

`get_config(arg)` of each config takes "variant[,key=value...]", e.g.
"qwen2.5-3b" or "r1-distill-7b,length=cond"; see `parse_arg`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections as mlc


@dataclasses.dataclass(frozen=True)
class PaperModel:
    """The released checkpoint a variant names, with the config.json facts that
    define its architecture (tests build tiny random models with the same
    model_type / tying / GQA ratio / head_dim relation)."""

    hf_id: str
    model_type: str  # config.json model_type ("qwen2": q/k/v bias; "qwen3": q/k norm)
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    rope_theta: float
    max_position_embeddings: int

    @property
    def num_params(self) -> int:
        d, f, dh = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_heads * dh, self.num_kv_heads * dh
        layer = d * (q + 2 * kv) + q * d + 3 * d * f
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb


# DeepSeek-R1-Distill-Qwen-* are Qwen2 architectures (model_type "qwen2", q/k/v
# bias, untied embeddings, rope_theta 1e4), not Llama.
MODELS: dict[str, PaperModel] = {
    "qwen2.5-1.5b": PaperModel(
        "Qwen/Qwen2.5-1.5B-Instruct", "qwen2", 1536, 28, 12, 2, 128, 8960, 151936, True, 1e6, 32768
    ),
    "qwen2.5-3b": PaperModel(
        "Qwen/Qwen2.5-3B-Instruct", "qwen2", 2048, 36, 16, 2, 128, 11008, 151936, True, 1e6, 32768
    ),
    "r1-distill-1.5b": PaperModel(
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
        "qwen2",
        1536,
        28,
        12,
        2,
        128,
        8960,
        151936,
        False,
        1e4,
        131072,
    ),
    "r1-distill-7b": PaperModel(
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
        "qwen2",
        3584,
        28,
        28,
        4,
        128,
        18944,
        152064,
        False,
        1e4,
        131072,
    ),
    # Qwen3: head_dim 128 != hidden / heads = 80.
    "qwen3-4b": PaperModel(
        "Qwen/Qwen3-4B-Instruct-2507",
        "qwen3",
        2560,
        36,
        32,
        8,
        128,
        9728,
        151936,
        True,
        5e6,
        262144,
    ),
}


def parse_arg(
    arg: str, *, variants: tuple[str, ...], default: str, **options: tuple[str, ...]
) -> dict[str, str]:
    """ "variant[,key=value,...]" -> {"model": variant, key: value, ...}.

    options: allowed values per key; the first is the default. Raises
    ValueError naming the bad part and the choices.
    """
    out = {"model": default, **{k: v[0] for k, v in options.items()}}
    parts = [p.strip() for p in (arg or "").split(",") if p.strip()]
    for i, part in enumerate(parts):
        if "=" not in part:
            if i:
                raise ValueError(
                    f"config arg {arg!r}: only the first part may be a bare "
                    f"model variant; write key=value for {part!r}."
                )
            key, value = "model", part
        else:
            key, value = (s.strip() for s in part.split("=", 1))
        choices = variants if key == "model" else options.get(key)
        if choices is None:
            raise ValueError(
                f"config arg {arg!r}: unknown key {key!r}; keys: {('model',) + tuple(options)}."
            )
        if value.lower() not in choices:
            raise ValueError(f"config arg {arg!r}: {key}={value!r} is not one of {choices}.")
        out[key] = value.lower()
    return out


def set_model(c: mlc.ConfigDict, variant: str) -> PaperModel:
    """Model + scale-out defaults for a billion-parameter policy.

    model.name is the hub id as a reminder: load_pretrained reads only local
    directories and says so; pass --config.model.name=/path/to/checkpoint.
    """
    spec = MODELS[variant]
    c.model.name = spec.hf_id
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.remat = True
    c.algo.logprob_chunk_size = 512  # [rows, 512, 152k] f32 logits per chunk
    c.mesh.shape = (1, -1, 1)
    c.mesh.axis_types = "explicit"
    return spec


def set_verl_defaults(c: mlc.ConfigDict) -> None:
    """Settings every paper config shares (verl's actor defaults the paper kept)."""
    c.task.num_train = 0  # all records of the files (0 = no truncation)
    c.task.num_eval = 0
    c.task.chat_template = True
    c.algo.eps = 1e-6
    c.algo.batch_norm = "token"
    c.algo.old_logprobs = "recompute"
    c.algo.aggregation = "dapo"  # verl token-mean
    c.algo.num_epochs = 1
    c.algo.dual_clip = 0.0
    c.optim.schedule = "constant"
    c.optim.warmup_steps = 0
    c.optim.weight_decay = 0.01  # verl actor AdamW default
    c.optim.b1, c.optim.b2, c.optim.eps = 0.9, 0.999, 1e-8
    c.optim.max_grad_norm = 1.0
    c.sampling.temperature = 1.0
    c.sampling.top_k = 0
    c.sampling.top_p = 1.0
    c.checkpoint.keep = 3


def set_dapo_recipe(c: mlc.ConfigDict, *, eval_samples: int) -> None:
    """The paper's Sec. 4.2 recipe (a DAPO-style verl run), shared by math and code.

    batch 512 prompts x G 16 (8192 rows/step), mini-batch 64 prompts, lr 1e-6,
    500 steps, clip 0.2 / 0.28, dynamic sampling (at most 4 generation rounds),
    KL loss 0.0005 with the mse estimator, 1024 + 8000 tokens; held-out
    `eval_samples` samples per problem at T 0.6, top-p 0.95.
    """
    c.algo.estimator = "gdpo"
    c.algo.num_prompts = 512
    c.algo.group_size = 16
    c.algo.num_minibatches = 8
    c.algo.num_microbatches = 128  # 8 devices: 1 row of 9024 tokens per device
    c.algo.clip_low = 0.2
    c.algo.clip_high = 0.28
    c.algo.beta = 0.0005
    c.algo.kl_estimator = "mse"
    c.algo.kl_in_reward = 0.0
    c.algo.entropy_coef = 0.0  # the paper gives none for math / code: no entropy bonus
    c.algo.dynamic_sampling = True
    c.algo.dynamic_sampling_max_tries = 4

    c.sampling.max_prompt_len = 1024
    c.sampling.max_new_tokens = 8000
    # 8192 rows x 9024 tokens do not fit one decode: 16 sampler calls of 512 rows.
    # KV cache of a call, 7B in bf16 (28 layers x 4 kv heads x 128 x k,v): 0.5 GB
    # per row, ~33 GB per device on 8 devices. Raise it on larger slices.
    c.sampling.rows_per_call = 512

    c.eval.greedy = False
    c.eval.num_samples = eval_samples
    c.eval.temperature = 0.6
    c.eval.top_p = 0.95

    c.optim.lr = 1e-6

    c.train.num_steps = 500
    c.train.eval_every = 50
    c.checkpoint.every = 25


def describe(c: mlc.ConfigDict) -> dict[str, Any]:
    """Derived sizes of a config (for docs and tests): rows per step / update / micro-batch."""
    a = c.algo
    rows = a.num_prompts * a.group_size
    per_update = rows // a.num_minibatches
    return {
        "rows_per_step": rows,
        "rows_per_update": per_update,
        "updates_per_step": a.num_minibatches * a.num_epochs,
        "rows_per_microbatch": per_update // a.num_microbatches,
        "tokens_per_row": c.sampling.max_prompt_len + c.sampling.max_new_tokens,
    }
