"""Batched KV-cache sampling with G generations per prompt and exact log-probs.

Every name loads its module on first use (PEP 562): a config check that reads
`SamplingParams` or the prompt buckets (`sampling.params`, NumPy only) pays for
neither the sampler's programs nor flax.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gdpo_jax.lazy_exports import lazy_exports

_LAZY = {
    "Rollouts": "gdpo_jax.sampling.params",
    "SamplingParams": "gdpo_jax.sampling.params",
    "bucket_length": "gdpo_jax.sampling.params",
    "Sampler": "gdpo_jax.sampling.sampler",
    "nucleus_mask": "gdpo_jax.sampling.filters",
    "sample_tokens": "gdpo_jax.sampling.filters",
    "top_k_candidates": "gdpo_jax.sampling.filters",
}

if TYPE_CHECKING:  # what type checkers and IDEs see (`as`: a re-export)
    from gdpo_jax.sampling.filters import nucleus_mask as nucleus_mask
    from gdpo_jax.sampling.filters import sample_tokens as sample_tokens
    from gdpo_jax.sampling.filters import top_k_candidates as top_k_candidates
    from gdpo_jax.sampling.params import Rollouts as Rollouts
    from gdpo_jax.sampling.params import SamplingParams as SamplingParams
    from gdpo_jax.sampling.params import bucket_length as bucket_length
    from gdpo_jax.sampling.sampler import Sampler as Sampler


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = list(_LAZY)
