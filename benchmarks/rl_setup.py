"""bench_rl's workload, shared by both sides and the profiling scripts: the sizes
(`SHAPES`), a random-init Hugging Face Llama checkpoint with a word-level
tokenizer that gdpo_jax and TRL both load, the prompts, the three Python
rewards (TRL's signature, and gdpo_jax's), and the step's model FLOPs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

HIDDEN, LAYERS, HEADS, KV_HEADS, INTER, VOCAB = 256, 4, 4, 2, 640, 512
PROMPTS, GENERATIONS, NEW_TOKENS, PROMPT_WORDS = 8, 8, 64, 8
# Our step accumulates gradients over 4 micro-batches of 16 rows (same gradient:
# the loss is a (sum, denominator) pair). On XLA:CPU this is ~25 % faster than one
# pass over 64 rows (activations stay cache-sized, fewer fresh pages per step);
# PyTorch measured no gain from it (docs/benchmarks.md#the-step-on-cpu-profiled).
OURS_MICROBATCHES = 4
# Our model's 4 layers run unrolled (model.scan_layers=False): at this size the
# layer scan's stacking and slicing of saved activations costs more than the
# unrolled form's one split of the weights and one concatenate of their gradients
# (profile_step's A/B: 1.04-1.18x faster steps on every CPU kind measured); at
# SmolLM2-135M's 30 layers too (SHAPES["smollm2"] below), though bench_model's plain
# forward+backward there, with no micro-batch loop, is no faster unrolled.
OURS_SCAN_LAYERS = False
# Our step runs each prompt once per micro-batch (algo.share_prompt, the trainer's
# default; same maths): here 2 groups of 8 rows per micro-batch and 9-token prompts,
# so it saves about 10 % of the tokens (benchmarks/bench_prompt_sharing.py).
OURS_SHARE_PROMPT = True


@dataclasses.dataclass(frozen=True)
class Shape:
    """One benchmark size: the Llama, the batch, and our step's layout."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    inter: int
    vocab: int
    prompts: int
    generations: int
    new_tokens: int
    tie: bool = False
    microbatches: int = OURS_MICROBATCHES
    scan_layers: bool = OURS_SCAN_LAYERS


SHAPES = {
    "tiny": Shape(HIDDEN, LAYERS, HEADS, KV_HEADS, INTER, VOCAB, PROMPTS, GENERATIONS, NEW_TOKENS),
    # SmolLM2-135M (benchmarks.bench_model.SMOLLM2_135M), random init. Micro-batches of
    # one group (4 rows), layers unrolled: this step is 1.10-1.13x faster than with the
    # layer scan (`python -m benchmarks.profile_step --model smollm2`, docs/benchmarks.md).
    "smollm2": Shape(576, 30, 9, 3, 1536, 49152, 4, 4, 64, tie=True, scan_layers=False),
}
TINY = SHAPES["tiny"]


# ------------------------------------------------------------------ fixtures
def make_tokenizer(vocab: int = VOCAB) -> Any:
    """Word-level tokenizer: <pad>, <s>, </s>, then words w3..w{vocab-1}."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<pad>",
    )
    fast.padding_side = "left"
    return fast


def make_checkpoint(out_dir: str, shape: Shape = TINY) -> str:
    """A random-init HF Llama checkpoint (+ tokenizer) both frameworks load."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.inter,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=shape.tie,
        torch_dtype="float32",
    )
    LlamaForCausalLM(cfg).save_pretrained(out_dir)
    make_tokenizer(shape.vocab).save_pretrained(out_dir)
    return out_dir


def prompts(n: int, seed: int = 0, vocab: int = VOCAB) -> list[str]:
    r = np.random.default_rng(seed)
    return [" ".join(f"w{i}" for i in r.integers(3, vocab, PROMPT_WORDS)) for _ in range(n)]


# Three cheap rewards with the TRL signature (and gdpo_jax's).
def reward_len(prompts, completions, **kw):
    return [min(len(c.split()) / NEW_TOKENS, 1.0) for c in completions]


def reward_has_w7(prompts, completions, **kw):
    return [float("w7" in c.split()) for c in completions]


def reward_unique(prompts, completions, **kw):
    return [len(set(c.split())) / max(len(c.split()), 1) for c in completions]


REWARDS = (reward_len, reward_has_w7, reward_unique)


def model_flops(rows: int, seq: int, *, beta: float, shape: Shape = TINY) -> float:
    """Matmul FLOPs of one training step: 6 N T (forward + backward) + attention,
    plus a reference forward (2 N T) when beta > 0. N excludes the embedding lookup."""
    d, kv = shape.hidden, shape.kv_heads * shape.hidden // shape.heads
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * shape.inter
    n = shape.layers * per_layer + d * shape.vocab
    tokens = rows * seq
    attn = shape.layers * 2 * 2 * rows * seq * seq * d  # QK^T and PV, forward
    fwd = 2 * n * tokens + attn
    return 3 * fwd + (fwd if beta > 0 else 0)
