"""Continuous batching over shared prompt slots (`continuous.py`, "Shared
prompts") == a prompt copy per lane, row for row; its slot schedule against
hand-worked steps (the same schedule `bench_longtail.lane_schedule` counts)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from gdpo_jax.sampling import Sampler, SamplingParams
from gdpo_jax.sampling.prompt_slots import suggested_prompt_slots
from tests import test_sampler
from tests.test_sampler import M

model, tok = test_sampler.model, test_sampler.tok  # the sampler tests' module fixtures

# 3 prompts x G = 4 rows, 4 lanes, 2 prompt slots (continuous_prompt_slots). Budgets:
# each prompt's first row runs 5 steps, the others 1 (prompt 2's rows all 1).
PROMPTS = [[6, 7, 8, 9, 10], [11], [12, 13]]
BUDGETS = [5, 1, 1, 1, 5, 1, 1, 1, 1, 1, 1, 1]


def test_suggested_prompt_slots_hold_three_times_full_lanes_prompts():
    assert suggested_prompt_slots(64, 8) == 24 and suggested_prompt_slots(64, 16) == 12
    assert suggested_prompt_slots(64, 4) == 48 and suggested_prompt_slots(5, 4) == 5
    assert suggested_prompt_slots(3, 2) == 3 and suggested_prompt_slots(1, 8) == 1  # <= lanes


@pytest.mark.parametrize(
    "layers,greedy,lanes,budgets,steps",
    [
        ("fused", True, 4, BUDGETS, (6, 7)),
        ("scan", False, 4, BUDGETS, (6, 7)),
        ("fused", True, 3, [2] * 12, (8, 8)),
    ],
)
def test_shared_prompt_slots_equal_per_lane_copies(
    model, tok, layers, greedy, lanes, budgets, steps
):
    """Greedy and sampled rows, log-probs and lengths equal the per-lane copies'.

    3 lanes, every row 2 steps (a row's second token reads its prompt's slot;
    2 prompt slots): steps 0-1 rows 0-2 (prompt 0's slot), 2-3
    row 3 and rows 4-5 (prompt 1): prompt 0 has no live row but a waiting one,
    so its slot is not free and prompt 1 takes the other; 4-5 rows 6-7 and row 8
    (prompt 2, into prompt 0's freed slot), 6-7 rows 9-11: 8 steps, as the
    copies'.

    BUDGETS, by hand (4 lanes). Copies: step 0 rows 0-3, step 1 rows 4-6, step 2
    rows 7-8, step 3 rows 9-10, step 4 row 11; rows 0 (steps 0-4) and 4 (1-5)
    end last: 6 steps. Shared (2 slots): step 0 rows 0-3 load prompt 0 into a
    slot, step 1 rows 4-6 prompt 1 into the other, step 2 row 7 (prompt 1's
    slot); row 8 (prompt 2) waits: rows 0 and 4 hold both slots until row 0 ends
    after step 4; step 5 rows 8-10, step 6 row 11: 7 steps.
    """
    params = SamplingParams(max_new_tokens=M, greedy=greedy, temperature=1.0)
    rows = {}
    for share in (False, True):
        s = Sampler(
            model,
            tok,
            eos_token_ids=(),
            continuous_slots=lanes,
            decode_layers=layers,
            continuous_prompt_slots=2 if share else 0,
        )
        rows[share] = s.generate(
            PROMPTS,
            params,
            num_generations=4,
            key=jax.random.key(2),
            max_new_tokens_per_row=budgets,
        )
        assert [key[2] for key in s._fns] == [(lanes, 4, 2 if share else 0)]
        np.testing.assert_array_equal(rows[share].lengths, budgets)
    a, b = rows[False], rows[True]
    np.testing.assert_array_equal(b.completion_ids, a.completion_ids)
    np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5)
    assert (a.info["decode_steps"], b.info["decode_steps"]) == steps
    assert (a.info["decoded_tokens"], b.info["decoded_tokens"]) == tuple(n * lanes for n in steps)


def test_prompt_slots_need_shared_prompt_caches_and_groups(model, tok):
    """W shared slots apply with share_prompt_cache and G > 1, else lanes copy."""
    params = SamplingParams(max_new_tokens=M, greedy=True)
    for share, g, w in ((True, 4, 2), (False, 4, 0), (True, 1, 0)):
        s = Sampler(
            model, tok, continuous_slots=4, share_prompt_cache=share, continuous_prompt_slots=2
        )
        s._get_fn(params, rows_per_prompt=g)  # builds (does not compile) the decode
        assert [key[2] for key in s._fns] == [(4, g, w)]
    with pytest.raises(ValueError, match="continuous_prompt_slots=-1"):
        Sampler(model, tok, continuous_slots=4, continuous_prompt_slots=-1)


def test_a_per_row_cache_index_reads_a_shared_prompt_only_through_cells():
    """Rows at different steps (a per-row index) cannot be prompt-major: without
    cells they would read the wrong prompt, so the cache is refused."""
    import jax.numpy as jnp

    from gdpo_jax.models.attention import attention_masks
    from gdpo_jax.models.kvcache import KVCache

    cache = KVCache(
        k=None,
        v=None,
        mask=jnp.zeros((4, 3), bool),
        index=jnp.zeros((4,), jnp.int32),
        prefix_mask=jnp.ones((2, 5), bool),
        prefix_k=jnp.zeros((1, 2, 1, 1, 5)),
        prefix_v=jnp.zeros((1, 2, 1, 5, 1)),
    )
    with pytest.raises(ValueError, match="only through prompt slots"):
        attention_masks(jnp.ones((4, 1), jnp.int32), cache)
    cells = cache.replace(prefix_cell=jnp.arange(4, dtype=jnp.int32), prefix_group=2)
    key_mask, allowed, _, per_row = attention_masks(jnp.ones((4, 1), jnp.int32), cells)
    assert per_row and key_mask.shape == (4, 3) and allowed.shape == (4, 1, 3)
