"""Batched KV-cache sampling with G generations per prompt and exact log-probs."""

from gdpo_jax.sampling.filters import nucleus_mask, sample_tokens, top_k_candidates
from gdpo_jax.sampling.sampler import Rollouts, Sampler, SamplingParams, bucket_length

__all__ = [
    "Rollouts",
    "Sampler",
    "SamplingParams",
    "bucket_length",
    "nucleus_mask",
    "sample_tokens",
    "top_k_candidates",
]
