"""Sampler: exactness against the full uncached forward, filters, stopping,
determinism, weight refresh and sharding.

References are written independently of the sampler: one uncached forward of
the whole [prompt | completion] sequence with NumPy log-softmax / sorting, or
plain Python loops over an unconstrained run.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_tokenizer import EOS_ID, make_tiny_tokenizer, words
from flax import nnx
from jax.sharding import PartitionSpec as P

from gdpo_jax.models.config import ModelConfig
from gdpo_jax.models.sharding import abstract_model, create_model
from gdpo_jax.sampling import Sampler, SamplingParams, bucket_length, nucleus_mask, top_k_candidates
from gdpo_jax.sampling.filters import (
    CDF_BLOCK,
    NUCLEUS_CANDIDATES,
    inverse_cdf_sample,
    row_keys,
    sample_tokens,
)

M = 10  # max_new_tokens shared by most tests (one compilation per config)
PROMPTS = ["w6 w7 w8 w9 w10", "w11", [{"role": "user", "content": "w12 w13"}]]
LOGIT_SCALE = 20.0  # sharpen the random model: nuclei of a few tokens
ATTN_SCALE = 6.0


def _make_model(mesh=None):
    cfg = ModelConfig.tiny()
    model = create_model(cfg, mesh=mesh, seed=0)
    model.lm_head.set_value(model.lm_head.get_value() * LOGIT_SCALE)
    # Sharper attention too, so positions and the cache contents matter.
    for name in ("q_proj", "k_proj"):
        w = getattr(model.layers, name)
        w.set_value(w.get_value() * ATTN_SCALE)
    return model


@pytest.fixture(scope="module")
def model():
    return _make_model()


@pytest.fixture(scope="module")
def tok(model):
    return make_tiny_tokenizer(model.cfg.vocab_size)


@pytest.fixture(scope="module")
def sampler(model, tok):
    # EOS off: rows run the full M tokens, so references need no stopping logic.
    return Sampler(model, tok, eos_token_ids=())


@pytest.fixture(scope="module")
def full_logits(model):
    """Uncached forward over [prompt | completion]: f32[N, P + C, V] (NumPy)."""
    graphdef = nnx.graphdef(model)
    fwd = jax.jit(lambda state, ids, mask: nnx.merge(graphdef, state)(ids, mask))

    def run(ro):
        ids = np.concatenate([ro.prompt_ids, ro.completion_ids], 1)
        mask = np.concatenate([ro.prompt_mask, ro.completion_mask], 1)
        return np.asarray(fwd(nnx.state(model), ids, mask), np.float64)

    return run


def _tempered_logp(logits, temperature):
    z = logits / temperature
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def base_run(sampler):
    """Unconstrained sampled run (T=1, no EOS) shared by the stopping tests."""
    return sampler.generate(
        PROMPTS, SamplingParams(max_new_tokens=M), num_generations=4, key=jax.random.key(7)
    )


# ----------------------------------------------------------------- greedy


@pytest.mark.parametrize(
    "decode_chunks,growth,layers", [(1, "auto", "auto"), (3, "copy", "auto"), (3, "prefix", "scan")]
)
def test_greedy_equals_stepwise_argmax_of_uncached_forward(
    model, tok, sampler, decode_chunks, growth, layers
):
    if decode_chunks != 1:  # decode phases (4 + 3 + 3 steps): a longer cache, or a prefix
        sampler = Sampler(
            model,
            tok,
            eos_token_ids=(),
            decode_chunks=decode_chunks,
            decode_growth=growth,
            decode_layers=layers,
        )
        assert sampler.decode_growth == growth
    ro = sampler.generate(
        PROMPTS,
        SamplingParams(max_new_tokens=M, greedy=True),
        num_generations=2,
        key=jax.random.key(0),
    )
    graphdef = nnx.graphdef(model)
    fwd = jax.jit(lambda state, ids, mask: nnx.merge(graphdef, state)(ids, mask))
    n, p = ro.prompt_ids.shape
    ids = np.concatenate([ro.prompt_ids, np.zeros((n, M), np.int32)], 1)
    mask = np.concatenate([ro.prompt_mask, np.zeros((n, M), np.int32)], 1)
    for t in range(M):  # causal: right padding does not change position p - 1 + t
        logits = np.asarray(fwd(nnx.state(model), ids, mask))
        ids[:, p + t] = logits[:, p - 1 + t].argmax(-1)
        mask[:, p + t] = 1
    np.testing.assert_array_equal(ro.completion_ids, ids[:, p:])
    assert ro.finish_reason == ["length"] * n
    np.testing.assert_array_equal(ro.lengths, np.full(n, M))
    # G greedy copies of a prompt agree; distinct prompts differ.
    np.testing.assert_array_equal(ro.completion_ids[0], ro.completion_ids[1])
    assert not np.array_equal(ro.completion_ids[0], ro.completion_ids[2])


# --------------------------------------------------------------- logprobs


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.7, 4, 0.8)])
def test_logprobs_are_tempered_unfiltered_log_softmax(
    sampler, full_logits, temperature, top_k, top_p
):
    params = SamplingParams(max_new_tokens=M, temperature=temperature, top_k=top_k, top_p=top_p)
    ro = sampler.generate(PROMPTS, params, num_generations=4, key=jax.random.key(1))
    p = ro.prompt_ids.shape[1]
    logp = _tempered_logp(full_logits(ro)[:, p - 1 : -1], temperature)  # predicts completion
    ref = np.take_along_axis(logp, ro.completion_ids[..., None], -1)[..., 0]
    m = ro.completion_mask.astype(bool)
    assert m.all()
    np.testing.assert_allclose(ro.logprobs[m], ref[m], atol=1e-5, rtol=0)
    assert np.all(ro.logprobs <= 0)


# ----------------------------------------------------------------- filters


def test_filters_hand_worked():
    probs = np.array([[0.5, 0.3, 0.15, 0.05]])
    lg = jnp.asarray(np.log(probs) + 3.0, jnp.float32)  # any shift

    def nucleus(top_p):
        return np.flatnonzero(np.asarray(nucleus_mask(lg, top_p))[0]).tolist()

    def top_k(k, top_p):
        w, ids = top_k_candidates(lg, k, top_p)
        return sorted(int(i) for i, v in zip(ids[0], w[0]) if v > 0)

    assert nucleus(0.7) == [0, 1]  # 0.5 < 0.7 <= 0.8
    assert nucleus(0.8) == [0, 1]  # smallest set with mass >= p
    assert nucleus(0.81) == [0, 1, 2]
    assert nucleus(0.01) == [0]  # the top token is always kept
    assert nucleus(1.0) == [0, 1, 2, 3]
    assert top_k(2, None) == [0, 1]
    assert top_k(3, 0.9) == [0, 1, 2]  # renormalized over top-3: .526, .842 < .9
    assert top_k(3, 0.8) == [0, 1]  # .526 < .8 <= .842
    assert top_k(10, None) == [0, 1, 2, 3]


def test_nucleus_mask_matches_sorting_reference():
    rng = np.random.default_rng(0)
    lg = rng.normal(size=(16, 300)).astype(np.float32) * rng.uniform(0.5, 5, (16, 1))
    lg[0, :5] = 2.0  # ties
    lg[1, 10:80] = 30.0  # 70 tied maxima: more than the candidates, all in the nucleus
    lg[2, :] = 0.0  # flat: the nucleus is nearly everything
    sizes = set()
    for top_p in (0.3, 0.9, 0.99):
        got = np.asarray(nucleus_mask(jnp.asarray(lg), top_p))
        p = np.exp(lg - lg.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        mass_above = np.array([[p[b][p[b] > p[b, i]].sum() for i in range(300)] for b in range(16)])
        want = mass_above < top_p
        # float rounding of the masses may only flip tokens right at the boundary
        unsure = np.abs(mass_above - top_p) < 1e-5
        np.testing.assert_array_equal(got[~unsure], want[~unsure])
        # A row's mask is its own: the same alone as in the batch.
        for r in (0, 1, 2, 7):
            alone = np.asarray(nucleus_mask(jnp.asarray(lg[r : r + 1]), top_p))[0]
            np.testing.assert_array_equal(alone, got[r])
        sizes |= set(want.sum(-1).tolist())
    # Both ways were taken: nuclei within the 64 candidates and beyond them.
    assert min(sizes) < NUCLEUS_CANDIDATES < max(sizes)


@pytest.mark.parametrize("top_k,top_p", [(50, None), (50, 0.9), (0, 0.9)])
def test_top_k_compiles_to_a_top_k_not_a_vocabulary_sort(top_k, top_p):
    """A top-k or top-p sampling step holds no full-vocabulary sort. Slicing top_k's
    output (the shift by its first value) once made XLA:CPU lower top_k to a sort of
    all [B, V] logits: 20x slower, 4.4x the whole decode of the tiny benchmark model."""
    z = jnp.zeros((16, 512))  # more rows than BISECT_ROWS: top-p orders the rows' flags
    f = jax.jit(lambda z, k: sample_tokens(z, k, 1.0, top_p, top_k=top_k))
    hlo = f.lower(z, jax.random.key(0)).compile().as_text()
    sorts = [line.strip() for line in hlo.splitlines() if " sort(" in line and "512" in line]
    assert not sorts, sorts
    # The candidates still match the sort they avoid: the 50 largest, ties by index.
    lg = np.random.default_rng(0).normal(size=(8, 512)).astype(np.float32)
    lg[0, 10:70] = 5.0  # 60 tied maxima: the first 50 by index are kept
    w, ids = top_k_candidates(jnp.asarray(lg), 50, None)
    want = np.argsort(-lg, axis=-1, kind="stable")[:, :50]
    np.testing.assert_array_equal(np.asarray(ids), want)
    ref = np.exp(np.take_along_axis(lg, want, -1) - lg.max(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(w), ref, rtol=1e-6)


def test_inverse_cdf_sampling_frequencies():
    w = jnp.asarray([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]] * 4000, jnp.float32)
    idx = np.asarray(inverse_cdf_sample(jax.random.key(0), w))
    freq = np.bincount(idx, minlength=6) / idx.size
    assert freq[[0, 2, 5]].sum() == 0  # zero weights never drawn
    np.testing.assert_allclose(freq, [0, 0.5, 0, 0.3, 0.2, 0], atol=0.03)


@pytest.mark.parametrize("v", [3 * CDF_BLOCK + 37, 7 * 128])  # padded; 128-wide blocks
def test_inverse_cdf_picks_where_one_running_sum_passes_u(v):
    """The two-level running sums (blocks, then within one) choose the index a single
    cumsum does: a NumPy searchsorted on the same uniforms, across block edges."""
    rng = np.random.default_rng(0)
    rows = 64
    w = rng.integers(0, 4, size=(rows, v)).astype(np.float32)  # integer sums are exact
    w[:5, : 2 * CDF_BLOCK] = 0  # whole blocks without weight first
    w[5] = 0
    w[5, v - 1] = 1  # only the last index
    w[6] = 0
    w[6, 0] = 2  # only the first
    w[7] = 0
    w[7, CDF_BLOCK - 1 : CDF_BLOCK + 1] = 1  # the two sides of a block edge
    keys = row_keys(jax.random.key(3), jnp.arange(rows), 0)
    got = np.asarray(inverse_cdf_sample(keys, jnp.asarray(w)))
    u = np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (1,), jnp.float32))(keys))[:, 0]
    cdf = np.cumsum(w, axis=-1)
    x = u * cdf[:, -1]  # f32, as the sampler scales it
    want = np.array([np.searchsorted(cdf[r], x[r], side="right") for r in range(rows)])
    np.testing.assert_array_equal(got, want)
    assert (w[np.arange(rows), got] > 0).all()
    assert got[5] == v - 1 and got[6] == 0 and got[7] in (CDF_BLOCK - 1, CDF_BLOCK)


@pytest.mark.parametrize("u", [0.0, float(np.nextafter(np.float32(1), np.float32(0)))])
def test_inverse_cdf_extreme_uniforms_land_on_weight(monkeypatch, u):
    """jax.random.uniform returns 0 about once in 2^23 draws: the first index with
    weight must be chosen then (not a zero-weight one before it), and the last one
    for the largest uniform below 1, with zero-weight blocks on both sides."""
    w = np.zeros((2, 4 * CDF_BLOCK), np.float32)
    w[0, CDF_BLOCK + 3] = w[0, 2 * CDF_BLOCK + 5] = 1.0
    w[1, 2 * CDF_BLOCK - 1] = w[1, 2 * CDF_BLOCK] = 0.5
    monkeypatch.setattr(jax.random, "uniform", lambda key, shape, dtype: jnp.full(shape, u, dtype))
    got = np.asarray(inverse_cdf_sample(jax.random.key(0), jnp.asarray(w)))
    want = [CDF_BLOCK + 3, 2 * CDF_BLOCK - 1] if u == 0 else [2 * CDF_BLOCK + 5, 2 * CDF_BLOCK]
    assert got.tolist() == want


@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (0, 0.6)])
def test_top_k_top_p_never_leave_the_allowed_set(sampler, full_logits, top_k, top_p):
    temperature = 1.3  # flatter: more candidates to wrongly emit
    params = SamplingParams(max_new_tokens=M, temperature=temperature, top_k=top_k, top_p=top_p)
    ro = sampler.generate(PROMPTS[:2], params, num_generations=32, key=jax.random.key(2))
    p = ro.prompt_ids.shape[1]
    logp = _tempered_logp(full_logits(ro)[:, p - 1 : -1], temperature)
    chosen = np.take_along_axis(logp, ro.completion_ids[..., None], -1)[..., 0]
    if top_k:
        rank = (logp > chosen[..., None]).sum(-1)  # tokens strictly more likely
        assert rank.max() < top_k
    else:
        probs = np.exp(logp)
        mass_before = np.where(probs > np.exp(chosen)[..., None], probs, 0).sum(-1)
        assert mass_before.max() < top_p + 1e-6
    # It does sample: the first tokens of one prompt's 32 rows are not all equal,
    # and their frequencies follow the renormalized filtered distribution.
    first = ro.completion_ids[:32, 0]
    assert len(set(first.tolist())) > 1
    probs0 = np.exp(logp[0, 0])
    order = np.argsort(-probs0)
    allowed = (
        order[:top_k]
        if top_k
        else order[: int((np.cumsum(probs0[order]) - probs0[order] < top_p).sum())]
    )
    target = probs0[allowed] / probs0[allowed].sum()
    emp = np.array([(first == a).mean() for a in allowed])
    assert 0.5 * np.abs(emp - target).sum() < 0.3  # TV distance, 32 draws


# ---------------------------------------------------------------- stopping


def test_eos_and_stop_token_ids_stop_rows_and_mask_the_rest(model, tok, base_run):
    toks = base_run.completion_ids
    # An EOS id and a stop id seen mid-completion in some rows, absent from the
    # last row (which must then run to "length").
    free = [int(t) for t in np.unique(toks[:-1, 2:6]) if t not in toks[-1]]
    eos = (free[0],)
    stop = (
        next(
            t
            for t in free[1:]
            if any(
                t in row and (eos[0] not in row or list(row).index(t) < list(row).index(eos[0]))
                for row in toks
            )
        ),
    )
    s = Sampler(model, tok, eos_token_ids=eos)
    ro = s.generate(
        PROMPTS,
        SamplingParams(max_new_tokens=M, stop_token_ids=stop),
        num_generations=4,
        key=jax.random.key(7),
    )
    reasons = set()
    for r in range(len(ro)):
        hits = [j for j, t in enumerate(toks[r]) if t in eos or t in stop]
        if hits:
            j = hits[0]
            want_len, want = j + 1, "eos" if toks[r, j] in eos else "stop"
        else:
            want_len, want = M, "length"
        reasons.add(want)
        assert ro.finish_reason[r] == want, r
        assert ro.lengths[r] == want_len
        np.testing.assert_array_equal(ro.completion_ids[r, :want_len], toks[r, :want_len])
        np.testing.assert_array_equal(ro.completion_mask[r], np.arange(M) < want_len)
        np.testing.assert_allclose(
            ro.logprobs[r, :want_len], base_run.logprobs[r, :want_len], atol=1e-6
        )
        assert np.all(ro.logprobs[r, want_len:] == 0)
        assert np.all(ro.completion_ids[r, want_len:] == s.pad_id)
    assert reasons == {"eos", "stop", "length"}


def test_default_eos_comes_from_config_and_tokenizer(model, tok):
    assert Sampler(model, tok).eos_token_ids == (EOS_ID,)
    cfg = model.cfg.replace(eos_token_id=(EOS_ID, 5))
    assert Sampler(abstract_model(cfg), tok).eos_token_ids == (EOS_ID, 5)
    assert Sampler(abstract_model(cfg.replace(eos_token_id=7)), tok).eos_token_ids == (EOS_ID, 7)


def test_stop_strings_truncate_at_first_occurrence(sampler, base_run):
    toks = base_run.completion_ids
    # Two consecutive words in the middle of row 0.
    j = next(j for j in range(2, M - 1) if min(toks[0, j], toks[0, j + 1]) >= 6)
    stop = words(toks[0, j : j + 2])
    ro = sampler.generate(
        PROMPTS,
        SamplingParams(max_new_tokens=M, stop_strings=(stop,)),
        num_generations=4,
        key=jax.random.key(7),
    )
    hit_rows = 0
    for r in range(len(ro)):
        k = next((k for k in range(1, M + 1) if stop in words(toks[r, :k])), None)
        if k is None:
            assert ro.finish_reason[r] == "length" and ro.lengths[r] == M
            assert ro.texts[r] == words(toks[r])
            continue
        hit_rows += 1
        assert ro.finish_reason[r] == "stop"
        assert ro.lengths[r] == k
        np.testing.assert_array_equal(ro.completion_ids[r, :k], toks[r, :k])
        assert ro.completion_mask[r].sum() == k and np.all(ro.logprobs[r, k:] == 0)
        full = words(toks[r, :k])
        assert ro.texts[r] == full[: full.find(stop) + len(stop)]
    assert hit_rows >= 1 and ro.lengths[0] <= j + 2


def test_stop_search_survives_the_tokenizers_space_clean_up():
    """A non-BPE tokenizer's clean-up rewrites a prefix's text once a later token arrives
    (" '" -> "'"): the stop " '" is in the 2-token prefix, gone at 3 and back at 8.
    The search cuts at the first occurrence (2), not where it found one last (8)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from gdpo_jax.sampling.stopping import apply_stop_strings

    vocab = {w: i for i, w in enumerate(["<pad>", "</s>", "x", "'", "y", "z", "w", "v", "u"])}
    t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tk = PreTrainedTokenizerFast(
        tokenizer_object=t, pad_token="<pad>", eos_token="</s>", clean_up_tokenization_spaces=True
    )
    ids = [vocab[w] for w in "x ' y z w v u '".split()]
    assert tk.decode(ids[:2]) == "x '" and tk.decode(ids[:3]) == "x'y"  # the rewrite
    tokens, lengths = np.array([ids, ids], np.int32), np.array([8, 3], np.int32)
    finish = ["length", "length"]
    texts = [tk.decode(ids), tk.decode(ids[:3])]  # row 1: its final text lacks the stop
    apply_stop_strings(tk, (" '",), tokens, lengths, finish, texts)
    assert lengths.tolist() == [2, 2] and finish == ["stop", "stop"]
    assert texts == ["x '", "x '"]


def test_a_stop_string_holding_a_special_token_is_found_on_the_host():
    """A stop string with a special token in it ("x <|s|>") never appears in the text
    decoded without special tokens, so when the device's exact-sequence check missed it
    (the text before the token tokenized otherwise), the row ran to its end. The host
    searches such stop strings in the text that keeps special tokens, and a plain stop
    string still cannot match inside a special token's name."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from gdpo_jax.sampling.stopping import apply_stop_strings

    vocab = {w: i for i, w in enumerate(["<pad>", "</s>", "<|s|>", "x", "y", "z"])}
    t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tk = PreTrainedTokenizerFast(
        tokenizer_object=t, pad_token="<pad>", eos_token="</s>", additional_special_tokens=["<|s|>"]
    )
    ids = [vocab[w] for w in "y x <|s|> z y".split()]
    assert tk.decode(ids, skip_special_tokens=True) == "y x z y"

    def run(stops: tuple[str, ...]) -> tuple[list[int], list[str], list[str]]:
        tokens, lengths = np.array([ids], np.int32), np.array([5], np.int32)
        finish, texts = ["length"], [tk.decode(ids, skip_special_tokens=True)]
        apply_stop_strings(tk, stops, tokens, lengths, finish, texts)
        return lengths.tolist(), finish, texts

    # Cut right after the special token; the text, without it, is what rewards see.
    assert run(("x <|s|>",)) == ([3], ["stop"], ["y x"])
    # With a plain stop string beside it, the earlier of the two cuts wins.
    assert run(("x <|s|>", "y")) == ([1], ["stop"], ["y"])
    assert run(("z", "x <|s|>")) == ([3], ["stop"], ["y x"])
    assert run(("s|",)) == ([5], ["length"], ["y x z y"])  # not inside "<|s|>"


def test_a_stop_string_the_vocabulary_cannot_spell_is_no_device_stop(sampler, tok):
    """'foo' tokenizes to the unknown id: as a device stop it ended every row that
    sampled that id, with no 'foo' in the text. Only the host's text check remains."""
    assert tok("foo", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    assert sampler._stop_sequences(("foo",)).tolist() == []  # no sequence
    spelled = words([7, 8])
    assert sampler._stop_sequences(("foo", spelled)).tolist() == [[7, 8]]


# ------------------------------------------------- determinism, weights, API


def test_same_key_same_output_no_recompile_and_fresh_weights(model, sampler):
    s, m = sampler, model
    params = SamplingParams(max_new_tokens=M, temperature=0.9, top_p=0.95)
    traces = s.num_traces
    a = s.generate(PROMPTS, params, num_generations=4, key=jax.random.key(3))
    assert s.num_traces == traces + 1
    b = s.generate(PROMPTS, params, num_generations=4, key=jax.random.key(3))
    c = s.generate(PROMPTS, params, num_generations=4, key=jax.random.key(4))
    np.testing.assert_array_equal(a.completion_ids, b.completion_ids)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert not np.array_equal(a.completion_ids, c.completion_ids)
    # G rows of one prompt are distinct samples.
    assert len({tuple(r) for r in a.completion_ids[:4].tolist()}) > 1
    # New weights (a trainer update) are read on the next call, without retracing.
    m.lm_head.set_value(-m.lm_head.get_value())
    try:
        d = s.generate(PROMPTS, params, num_generations=4, key=jax.random.key(3))
    finally:
        m.lm_head.set_value(-m.lm_head.get_value())
    assert not np.array_equal(a.completion_ids, d.completion_ids)
    # A new temperature / top_p value does not recompile either.
    s.generate(
        PROMPTS,
        SamplingParams(max_new_tokens=M, temperature=0.5, top_p=0.7),
        num_generations=4,
        key=jax.random.key(3),
    )
    assert s.num_traces == traces + 1


def test_rollout_layout_and_prompt_encoding(sampler, tok, base_run):
    ro = base_run
    n = len(PROMPTS) * 4
    assert ro.completion_ids.shape == (n, M) and ro.prompt_ids.shape == (n, 32)
    np.testing.assert_array_equal(ro.group_ids, np.arange(n) // 4)
    np.testing.assert_array_equal(ro.prompt_index, ro.group_ids)
    chat = tok.apply_chat_template(PROMPTS[2], add_generation_prompt=True, tokenize=False)
    want = [
        tok(PROMPTS[0])["input_ids"],
        tok(PROMPTS[1])["input_ids"],
        tok(chat, add_special_tokens=False)["input_ids"],
    ]
    assert want[2][0] == 1 and want[2][-1] == 4  # <s> ... <|assistant|>
    for r in range(n):
        e = want[r // 4]
        np.testing.assert_array_equal(ro.prompt_ids[r, -len(e) :], e)  # left padded
        np.testing.assert_array_equal(ro.prompt_mask[r], np.arange(32) >= 32 - len(e))
    assert ro.texts[0] == words(ro.completion_ids[0])
    assert sampler.encode_prompts([[5, 6, 7]]) == [[5, 6, 7]]
    with pytest.raises(ValueError, match="chat_template=False"):
        sampler.encode_prompts(PROMPTS[2:], chat_template=False)
    with pytest.raises(ValueError, match="zero tokens"):
        sampler.encode_prompts([""])
    # Past the vocabulary: NaN log-probs under a mask of 1; negative: another token.
    vocab = sampler.model.cfg.vocab_size
    for bad in (vocab, -5):
        with pytest.raises(
            ValueError, match=rf"prompts\[1\] has token id {bad} outside .* \[0, {vocab}\)"
        ):
            sampler.encode_prompts([[5], [7, bad]])
    assert bucket_length(33, (32, 64)) == 64 and bucket_length(130, (32, 64)) == 192


@pytest.mark.parametrize(
    "bad",
    [
        dict(max_new_tokens=0),
        dict(temperature=0.0),
        dict(temperature=1e-39),  # logits / T overflow: NaN log-probs, tokens not the argmax
        dict(temperature=float("nan")),
        dict(temperature=float("inf")),  # logits / inf = 0: a uniform draw, not a sampler
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_k=-1),
        dict(stop_strings=("",)),
        # int() truncated these (10.7 -> 10 new tokens, top_k=True -> 1) without a word.
        dict(max_new_tokens=10.7),
        dict(max_new_tokens=float("inf")),
        dict(max_new_tokens="8"),
        dict(top_k=2.5),
        dict(top_k=True),
        # int() made 37.7 a stop id 37; bool("false") turned greedy on; a '1' failed in a
        # comparison naming nothing; a non-str stop string failed inside the tokenizer.
        dict(stop_token_ids=(37.7,)),
        dict(stop_token_ids=(True,)),
        dict(stop_token_ids=(-1,)),
        dict(stop_token_ids=5),
        dict(greedy="false"),
        dict(temperature="1"),
        dict(top_p="0.9"),
        dict(stop_strings=(5,)),
        dict(stop_strings=("a", None)),
    ],
)
def test_bad_sampling_params_name_the_field(bad):
    field = next(iter(bad))
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{"max_new_tokens": 4, **bad})


def test_whole_float_counts_are_ints():
    # A config's 64.0 is a count; the params keep ints, so they hash like the int's.
    p = SamplingParams(max_new_tokens=np.float32(64.0), top_k=np.int64(5))
    assert (p.max_new_tokens, p.top_k) == (64, 5)
    assert type(p.max_new_tokens) is int and type(p.top_k) is int
    assert hash(p) == hash(SamplingParams(max_new_tokens=64, top_k=5))


def test_the_lowest_temperature_allowed_is_greedy_with_finite_logprobs(sampler):
    from gdpo_jax.sampling.params import MIN_TEMPERATURE

    runs = [
        sampler.generate(
            PROMPTS,
            SamplingParams(max_new_tokens=M, temperature=MIN_TEMPERATURE, greedy=greedy),
            key=jax.random.key(5),
        )
        for greedy in (False, True)
    ]
    np.testing.assert_array_equal(runs[0].completion_ids, runs[1].completion_ids)
    for ro in runs:
        assert np.isfinite(ro.logprobs).all()


# ---------------------------------------------------------------- sharding


def test_sharded_equals_unsharded(sampler, tok):
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
    sharded = Sampler(_make_model(mesh), tok, mesh=mesh, eos_token_ids=())
    assert sharded.model.layers.q_proj.get_value().sharding.spec == P(None, "fsdp", "tensor")
    params = SamplingParams(max_new_tokens=M, temperature=0.8, top_k=8)
    # 3 prompts x G=3 = 9 rows: padded to 12 for the 4 batch shards.
    a = sampler.generate(PROMPTS, params, num_generations=3, key=jax.random.key(5))
    b = sharded.generate(PROMPTS, params, num_generations=3, key=jax.random.key(5))
    assert b.info["batch_rows"] == 12 and len(b) == 9
    np.testing.assert_array_equal(a.completion_ids, b.completion_ids)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert a.finish_reason == b.finish_reason and a.texts == b.texts


def test_sharded_shared_prompt_cache_equals_unsharded_copies(tok):
    """4 prompts x G=2 = 8 rows fill the 4 batch shards (no padding): the
    prompts' cache is shared across a prompt's rows and sharded by prompt. Top-p
    on: the nucleus's candidates and its batch-wide bisection loop run sharded."""
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
    prompts = ["w6 w7 w8", "w9", "w10 w11 w12 w13", "w14 w15"]
    params = SamplingParams(max_new_tokens=M, temperature=0.8, top_p=0.9)
    sharded = Sampler(_make_model(mesh), tok, mesh=mesh, eos_token_ids=())
    plain = Sampler(_make_model(), tok, eos_token_ids=(), share_prompt_cache=False)
    a = plain.generate(prompts, params, num_generations=2, key=jax.random.key(6))
    b = sharded.generate(prompts, params, num_generations=2, key=jax.random.key(6))
    assert [spec.group for _, spec, _ in sharded._fns] == [2]
    np.testing.assert_array_equal(a.completion_ids, b.completion_ids)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


@pytest.mark.parametrize("axis_type", ["auto", "explicit"])
def test_sharded_continuous_batching_equals_one_device(tok, axis_type):
    """Continuous batching on a 2x2x2 mesh: every batch shard runs its own rows
    through its own slots (weights gathered once per call). Greedy rows, lengths
    and finish reasons equal the static decode's on one device, row for row;
    sampled rows equal continuous batching's on one device (a row's key folds in
    its global index); 5 prompts x G=3 = 15 rows: padded to 16 (a padding row,
    a group split across shards). Under explicit axes the shards' lanes read 2
    shared prompt slots (continuous_prompt_slots), under auto axes copies."""
    from jax.sharding import AxisType

    types = (AxisType.Explicit if axis_type == "explicit" else AxisType.Auto,) * 3
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=types)
    prompts = [[6 + (7 * i + j) % 40 for j in range(1 + i % 4)] for i in range(5)]
    plain_model = _make_model()
    probe = Sampler(plain_model, tok, eos_token_ids=()).generate(
        prompts,
        SamplingParams(max_new_tokens=M, greedy=True),
        num_generations=3,
        key=jax.random.key(0),
    )
    eos = (int(np.bincount(probe.completion_ids[:, 1 : M - 2].ravel()).argmax()),)
    for greedy in (True, False):
        params = SamplingParams(max_new_tokens=M, greedy=greedy, temperature=1.0)
        one = Sampler(plain_model, tok, eos_token_ids=eos, continuous_slots=0 if greedy else 2)
        w = 2 if axis_type == "explicit" else 0
        sharded = Sampler(
            _make_model(mesh),
            tok,
            mesh=mesh,
            eos_token_ids=eos,
            continuous_slots=2,
            continuous_prompt_slots=w,
        )
        a = one.generate(prompts, params, num_generations=3, key=jax.random.key(3))
        b = sharded.generate(prompts, params, num_generations=3, key=jax.random.key(3))
        assert b.info["batch_rows"] == 16 and len(b) == 15
        assert [key[2] for key in sharded._fns][-1] == (2, 3, w)
        if greedy:
            assert len(set(a.lengths.tolist())) > 1  # the EOS ends some rows early
        np.testing.assert_array_equal(b.completion_ids, a.completion_ids)
        np.testing.assert_array_equal(b.lengths, a.lengths)
        assert b.finish_reason == a.finish_reason
        np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5)
        assert b.info["generated_tokens"] == a.info["generated_tokens"]
        # Every useful token was a lane-step of some shard (summed over the shards).
        assert b.info["decoded_tokens"] >= b.info["generated_tokens"]


def _one_call_and_chunks(sampler, prompts, params, key, max_prompt_len):
    """`sample_and_score` of G=2 rows per prompt, in one call and one prompt per call;
    each row scores its completion's length."""
    from gdpo_jax.train.rollout import sample_and_score

    kw = dict(
        sampler=sampler,
        runner=lambda prompts, completions, examples, **kw: (
            np.asarray([[len(c)] for c in completions], np.float32),
            {},
        ),
        params=params,
        group_size=2,
        key=key,
        max_prompt_len=max_prompt_len,
        pad_id=0,
        chat_template=False,
    )
    records = [{"prompt": p} for p in prompts]
    return sample_and_score(records, **kw), sample_and_score(records, prompts_per_call=1, **kw)


@pytest.mark.parametrize("greedy", [True, False])
def test_chunked_rollouts_equal_one_call(sampler, greedy):
    # Chunking the sampler calls (train.rollout, sampling.rows_per_call) gives the
    # same batch: each row draws from its own stream (its id continues across
    # chunks), and each chunk is left padded to its own prompt bucket and
    # re-padded to max_prompt_len.
    one, chunked = _one_call_and_chunks(
        sampler,
        ("w6 w7 w8 w9 w10", "w11", "w12 w13", "w14 w15 w16"),
        SamplingParams(max_new_tokens=M, greedy=greedy, temperature=1.0),
        jax.random.key(0),
        32,
    )
    assert chunked["sample_calls"] == 4
    for k in (
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        "rewards",
        "group_ids",
    ):
        np.testing.assert_array_equal(chunked[k], one[k], err_msg=k)
    np.testing.assert_allclose(chunked["old_logp"], one["old_logp"], atol=1e-5)
    assert chunked["texts"] == one["texts"]


# ------------------------------------------- sampler == trainer log-probs
@pytest.mark.parametrize(
    "param_dtype,dtype",
    [("float32", "float32"), ("float32", "bfloat16"), ("bfloat16", "bfloat16")],
)
def test_sampler_logprobs_equal_trainer_logprobs(tok, param_dtype, dtype):
    """old_logprobs="sampler" needs the first update's ratio to be 1: the
    sampler's log-probs must be the trainer's (completion_logprobs, chunked or
    not) for the same tokens. Both use unembed_logits; before, the trainer
    upcast f32 params where the sampler cast them to bf16 (max |delta| 0.015
    with f32 params / bf16 compute). atol 1e-4: what is left is the cached
    vs uncached forward's summation order (measured <= 4e-6 here), 100x below
    that bug."""
    from gdpo_jax.train.completion import completion_logprobs

    cfg = ModelConfig.tiny(param_dtype=param_dtype, dtype=dtype)
    model = create_model(cfg, seed=0)
    model.lm_head.set_value(model.lm_head.get_value() * LOGIT_SCALE)
    ro = Sampler(model, tok, eos_token_ids=()).generate(
        PROMPTS, SamplingParams(max_new_tokens=M), num_generations=4, key=jax.random.key(1)
    )
    batch = {
        k: jnp.asarray(getattr(ro, k))
        for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
    }
    m = ro.completion_mask.astype(bool)
    graphdef = nnx.graphdef(model)
    for chunk in (0, 4):
        fn = jax.jit(
            lambda state, b, chunk=chunk: completion_logprobs(
                nnx.merge(graphdef, state), b, chunk_size=chunk
            )[0]
        )
        got = np.asarray(fn(nnx.state(model), batch))
        np.testing.assert_allclose(ro.logprobs[m], got[m], atol=1e-4, rtol=0, err_msg=str(chunk))


@pytest.mark.parametrize("slots,chunks", [(1, None), (3, None), (5, None), (3, 4)])
def test_continuous_batching_greedy_equals_static_row_for_row(model, tok, slots, chunks):
    """Finished rows hand their slot to waiting rows: greedy tokens, log-probs,
    lengths and finish reasons equal the static decode's, row for row; fewer
    row-steps are decoded than the static batch's steps x rows. chunks=4: the
    cache grows in phases (ends 3, 6, 8, 10) while lanes are at different steps."""
    prompts = [[6 + (7 * i + j) % 40 for j in range(1 + i % 5)] for i in range(7)]
    params = SamplingParams(max_new_tokens=M, greedy=True)
    probe = Sampler(model, tok, eos_token_ids=()).generate(
        prompts, params, num_generations=2, key=jax.random.key(0)
    )
    # An EOS id that ends some rows early and leaves others to run to "length".
    cands = [int(t) for t in np.unique(probe.completion_ids[:, 1 : M - 2])]
    counts = [int(np.any(probe.completion_ids[:, : M - 1] == t, axis=1).sum()) for t in cands]
    eos = (cands[int(np.argmax([c if c < len(probe) else -1 for c in counts]))],)
    static = Sampler(model, tok, eos_token_ids=eos)
    cont = Sampler(model, tok, eos_token_ids=eos, continuous_slots=slots, decode_chunks=chunks)
    a = static.generate(prompts, params, num_generations=2, key=jax.random.key(0))
    b = cont.generate(prompts, params, num_generations=2, key=jax.random.key(0))
    assert len(set(a.lengths.tolist())) > 1 and "length" in a.finish_reason
    np.testing.assert_array_equal(b.completion_ids, a.completion_ids)
    np.testing.assert_array_equal(b.lengths, a.lengths)
    assert b.finish_reason == a.finish_reason
    np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5)
    assert b.info["generated_tokens"] == a.info["generated_tokens"]
    if slots == 1:  # one slot runs the rows back to back: nothing wasted
        assert b.info["decoded_tokens"] == b.info["generated_tokens"]
    else:  # fewer row-steps than the static batch's steps x rows
        assert b.info["decoded_tokens"] < a.info["decode_steps"] * len(a)


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 0.9)])
def test_continuous_batching_sampled_equals_static_row_for_row(model, tok, top_k, top_p):
    """Sampled rows: a row draws its t-th token from fold_in(fold_in(key, row), t)
    in both decoders, so the rows equal the static decode's although lanes start
    rows at different steps (EOS ends some rows early)."""
    prompts = [[6 + (5 * i + j) % 40 for j in range(1 + i % 4)] for i in range(5)]
    params = SamplingParams(max_new_tokens=M, temperature=1.0, top_k=top_k, top_p=top_p)
    probe = Sampler(model, tok, eos_token_ids=()).generate(
        prompts, params, num_generations=3, key=jax.random.key(3)
    )
    # EOS: the most frequent token the rows sample before their last step.
    eos = (int(np.bincount(probe.completion_ids[:, : M - 1].ravel()).argmax()),)
    static = Sampler(model, tok, eos_token_ids=eos).generate(
        prompts, params, num_generations=3, key=jax.random.key(3)
    )
    cont = Sampler(model, tok, eos_token_ids=eos, continuous_slots=4).generate(
        prompts, params, num_generations=3, key=jax.random.key(3)
    )
    assert len(set(static.lengths.tolist())) > 1  # rows end at different steps
    np.testing.assert_array_equal(cont.completion_ids, static.completion_ids)
    np.testing.assert_array_equal(cont.lengths, static.lengths)
    np.testing.assert_allclose(cont.logprobs, static.logprobs, atol=1e-5)


@pytest.mark.parametrize("slots", [0, 3])
def test_chunks_with_their_first_row_sample_what_one_call_does(model, tok, slots):
    """generate(first_row=...) over consecutive chunks == one call over the batch
    (each row's stream is its id's), and not what restarting the ids gives."""
    params = SamplingParams(max_new_tokens=M, temperature=1.0)
    s = Sampler(model, tok, eos_token_ids=(), continuous_slots=slots)
    key = jax.random.key(5)
    whole = s.generate(PROMPTS, params, num_generations=2, key=key)
    a = s.generate(PROMPTS[:1], params, num_generations=2, key=key)
    b = s.generate(PROMPTS[1:], params, num_generations=2, key=key, first_row=2)
    assert a.info["batch_rows"] == 2
    np.testing.assert_array_equal(
        np.concatenate([a.completion_ids, b.completion_ids]), whole.completion_ids
    )
    restarted = s.generate(PROMPTS[1:], params, num_generations=2, key=key)
    assert (restarted.completion_ids != whole.completion_ids[2:]).any()


@pytest.mark.parametrize("slots", [0, 2])
def test_padded_chunks_on_a_mesh_sample_what_one_call_does(tok, slots):
    """Chunks of 1 prompt x G=2 on 4 batch shards: each call pads 2 rows to 4. The
    chunks' row ids count real rows only, so they equal one call over the 3 prompts
    (6 rows, padded to 8). Numbering padding rows too gave the second chunk's rows
    the ids 4 and 5 where the one call has 2 and 3."""
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
    s = Sampler(_make_model(mesh), tok, mesh=mesh, eos_token_ids=(), continuous_slots=slots)
    one, chunked = _one_call_and_chunks(
        s,
        ("w6 w7 w8", "w9", "w10 w11 w12 w13"),
        SamplingParams(max_new_tokens=M, temperature=1.0),
        jax.random.key(8),
        16,
    )
    assert chunked["sample_calls"] == 3
    np.testing.assert_array_equal(chunked["completion_ids"], one["completion_ids"])
    np.testing.assert_allclose(chunked["old_logp"], one["old_logp"], atol=1e-5)
    assert len({tuple(r) for r in one["completion_ids"].tolist()}) == 6  # really sampled


@pytest.mark.parametrize(
    "layers,slots,greedy",
    [("fused", 0, True), ("fused", 0, False), ("fused", 3, True), ("unrolled", 0, False)],
)
def test_unrolled_decode_equals_the_scan(model, tok, layers, slots, greedy):
    """The decode loop's unrolled forms (per-layer cache buffers, weights sliced
    once per call, optionally q/k/v and gate/up fused; decode.py's docstring)
    give the stacked scan's rows, in the static and the continuous decoder."""
    params = SamplingParams(max_new_tokens=M, greedy=greedy, temperature=1.0)
    rows = {}
    for form in ("scan", layers):
        s = Sampler(model, tok, eos_token_ids=(), continuous_slots=slots, decode_layers=form)
        rows[form] = s.generate(PROMPTS, params, num_generations=3, key=jax.random.key(4))
        assert [spec.layers for _, spec, _ in s._fns] == [form]
    np.testing.assert_array_equal(rows[layers].completion_ids, rows["scan"].completion_ids)
    np.testing.assert_allclose(rows[layers].logprobs, rows["scan"].logprobs, atol=1e-5)


@pytest.mark.parametrize("layers,greedy", [("scan", False), ("fused", True), ("fused", False)])
def test_shared_prompt_cache_equals_per_row_copies(model, tok, layers, greedy):
    """share_prompt_cache (DecodeSpec.group: each prompt's cache kept once for
    its G rows) gives the rows of a per-row copy of the prompt's cache."""
    params = SamplingParams(max_new_tokens=M, greedy=greedy, temperature=1.0)
    rows = {}
    for share in (False, True):
        s = Sampler(model, tok, eos_token_ids=(), decode_layers=layers, share_prompt_cache=share)
        rows[share] = s.generate(PROMPTS, params, num_generations=3, key=jax.random.key(4))
        assert [spec.group for _, spec, _ in s._fns] == [3 if share else 0]
    np.testing.assert_array_equal(rows[True].completion_ids, rows[False].completion_ids)
    np.testing.assert_allclose(rows[True].logprobs, rows[False].logprobs, atol=1e-5)


@pytest.mark.parametrize(
    "layers,share,slots,on_mesh",
    [
        ("scan", True, 0, False),
        ("fused", True, 0, False),
        ("fused", False, 0, False),
        ("scan", True, 3, False),
        ("scan", True, 0, True),
    ],
)
def test_prefix_growth_samples_what_copy_growth_does(model, tok, layers, share, slots, on_mesh):
    """DecodeSpec.growth "prefix" (one cache of all slots, each phase reads a
    prefix of it) samples the rows of "copy" (a longer cache per phase): the
    static decode in its forms, with and without a shared prompt cache, on a
    (2, 2, 2) mesh, and continuous batching (lanes at different steps across
    the phase ends)."""
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor")) if on_mesh else None
    if on_mesh:
        model = _make_model(mesh)
    params = SamplingParams(max_new_tokens=M, temperature=1.0)
    rows = {}
    for growth in ("copy", "prefix"):
        s = Sampler(
            model,
            tok,
            mesh=mesh,
            eos_token_ids=(),
            decode_chunks=4,
            decode_growth=growth,
            decode_layers=layers,
            share_prompt_cache=share,
            continuous_slots=slots,
        )
        rows[growth] = s.generate(PROMPTS, params, num_generations=4, key=jax.random.key(5))
        assert [(spec.growth, spec.group) for _, spec, _ in s._fns] == [
            (growth, 4 if share and not slots else 0)
        ]
    np.testing.assert_array_equal(rows["prefix"].completion_ids, rows["copy"].completion_ids)
    np.testing.assert_allclose(rows["prefix"].logprobs, rows["copy"].logprobs, atol=1e-5)


def test_decode_chunks_split_the_budget_into_phases():
    """One phase per 32 tokens, at most 4 (or as asked), near-equal, each >= 1 token."""
    from gdpo_jax.sampling.decode import decode_chunks

    assert decode_chunks(512) == (128, 128, 128, 128)
    assert decode_chunks(33) == (17, 16) and decode_chunks(32) == (32,)
    assert decode_chunks(10, 4) == (3, 3, 2, 2) and decode_chunks(3, 8) == (1, 1, 1)


def test_decode_layers_default_and_bad_value(model, tok):
    from gdpo_jax.backend import target_backend
    from gdpo_jax.sampling.decode import decode_layers_default

    assert Sampler(model, tok).decode_layers == "fused"  # CPU, f32, one device
    assert decode_layers_default("float32", one_device=False) == "unrolled"
    assert decode_layers_default("bfloat16", True) == "scan"  # the trainer's bf16 roundings
    with target_backend("cuda"):
        assert decode_layers_default("float32", True) == "scan"
        # One GPU in bf16 / f16: fused, its weights cast once per call (2.4x faster
        # decode on an H200 than the scan, rows bit-equal); several GPUs: the scan.
        assert decode_layers_default("bfloat16", True) == "fused"
        assert decode_layers_default("float16", True) == "fused"
        assert decode_layers_default("bfloat16", False) == "scan"
    with target_backend("tpu"):
        assert decode_layers_default("bfloat16", True) == "scan"
    with pytest.raises(ValueError, match="decode_layers='unroll'"):
        Sampler(model, tok, decode_layers="unroll")


def test_decode_growth_default_and_bad_value(model, tok):
    from gdpo_jax.backend import target_backend
    from gdpo_jax.sampling.decode import decode_growth_default

    # XLA:CPU copies a prefix slice out for the unrolled forms' dots: they keep "copy".
    assert Sampler(model, tok).decode_growth == "copy"  # CPU, fused
    assert Sampler(model, tok, decode_layers="scan").decode_growth == "prefix"
    assert decode_growth_default("unrolled") == "copy"
    for backend in ("cuda", "tpu"):  # the compiled programs read the prefix in place
        with target_backend(backend):
            assert decode_growth_default("fused") == decode_growth_default("scan") == "prefix"
    with pytest.raises(ValueError, match="decode_growth='grow'"):
        Sampler(model, tok, decode_growth="grow")


def test_weights_in_casts_floating_arrays_once_and_keeps_the_model_exact():
    # The unrolled decode forms copy the weights once per call in the compute dtype
    # (decode.weights_in) instead of casting f32 weights at every step. The model
    # casts every weight to that dtype before use, so its outputs must not change.
    from gdpo_jax.sampling.decode import weights_in

    mc = ModelConfig.tiny(dtype="bfloat16", param_dtype="float32", vocab_size=128)
    graphdef, state = nnx.split(create_model(mc, seed=0))
    cast = weights_in(state, jnp.bfloat16)
    leaves = jax.tree.leaves(cast)
    assert leaves and all(x.dtype == jnp.bfloat16 for x in leaves)
    for a, b in zip(jax.tree.leaves(state), leaves):
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.bfloat16)), np.asarray(b))
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 128, (2, 12)), jnp.int32)
    mask = jnp.ones((2, 12), jnp.int32).at[1, :3].set(0)

    @jax.jit
    def logits(s):
        return nnx.merge(graphdef, s)(ids, mask)[0]

    np.testing.assert_array_equal(np.asarray(logits(state)), np.asarray(logits(cast)))


def test_continuous_batching_rejects_negative_slots(model, tok):
    with pytest.raises(ValueError, match="continuous_slots=-1"):
        Sampler(model, tok, continuous_slots=-1)


@pytest.mark.parametrize("chunks", [None, 4])
def test_per_row_budgets_static_and_continuous(model, tok, chunks):
    """max_new_tokens_per_row ends rows at their budget ("length") in both
    decoders, with one cache or a cache growing in phases (chunks=4)."""
    prompts = [[6 + i, 7 + i] for i in range(4)]
    params = SamplingParams(max_new_tokens=M, greedy=True)
    limits = [1, M, 3, 2, 5, 1, M, 4]
    full = Sampler(model, tok, eos_token_ids=()).generate(
        prompts, params, num_generations=2, key=jax.random.key(0)
    )
    for slots in (0, 3):
        s = Sampler(model, tok, eos_token_ids=(), continuous_slots=slots, decode_chunks=chunks)
        ro = s.generate(
            prompts, params, num_generations=2, key=jax.random.key(0), max_new_tokens_per_row=limits
        )
        np.testing.assert_array_equal(ro.lengths, limits)
        assert set(ro.finish_reason) == {"length"}
        for r, n in enumerate(limits):
            np.testing.assert_array_equal(ro.completion_ids[r, :n], full.completion_ids[r, :n])
        if slots:
            assert ro.info["decoded_tokens"] < ro.info["generated_tokens"] + 3 * M
    with pytest.raises(ValueError, match="max_new_tokens_per_row needs 8 values"):
        s.generate(
            prompts,
            params,
            num_generations=2,
            key=jax.random.key(0),
            max_new_tokens_per_row=[M + 1] * 8,
        )


def test_continuous_sampled_rows_do_not_depend_on_the_slot_count(model, tok):
    """Sampled rows draw with fold_in(fold_in(key, row), t): the same rows with
    2 or 5 slots (different schedules), and a different key gives other rows."""
    prompts = [[6 + i, 9 + i] for i in range(5)]
    params = SamplingParams(max_new_tokens=M, temperature=1.0)
    # An EOS id drawn by some rows and not others (a row's draws do not depend on the
    # EOS until it ends): the rows finish at different steps, so the schedules differ.
    probe = Sampler(model, tok, eos_token_ids=()).generate(
        prompts, params, num_generations=2, key=jax.random.key(1)
    )
    head = probe.completion_ids[:, : M - 1]
    cands = [int(t) for t in np.unique(head)]
    counts = [int(np.any(head == t, axis=1).sum()) for t in cands]
    eos = (cands[int(np.argmax([c if c < len(probe) else -1 for c in counts]))],)
    outs = [
        Sampler(model, tok, eos_token_ids=eos, continuous_slots=s).generate(
            prompts, params, num_generations=2, key=jax.random.key(k)
        )
        for s, k in ((2, 1), (5, 1), (5, 2))
    ]
    assert len(set(outs[0].lengths.tolist())) > 1  # the EOS ends some rows early
    np.testing.assert_array_equal(outs[0].completion_ids, outs[1].completion_ids)
    np.testing.assert_allclose(outs[0].logprobs, outs[1].logprobs, atol=1e-5)
    assert not np.array_equal(outs[1].completion_ids, outs[2].completion_ids)


def test_one_row_on_an_explicit_mesh_samples_what_a_larger_batch_does(model, tok):
    # A call of one row (a 1-prompt eval chunk, train.eval_num_examples=1) on an explicit-
    # axes mesh failed in the token choice: JAX could not resolve the sharding of the
    # gather over f32[1@(data,fsdp), V]. Such a call now runs 2 rows, the second inactive.
    from jax.sharding import AxisType

    mesh = jax.make_mesh((1, 1, 1), ("data", "fsdp", "tensor"), axis_types=(AxisType.Explicit,) * 3)
    one = Sampler(_make_model(mesh), tok, mesh=mesh, eos_token_ids=())
    for params in (
        SamplingParams(max_new_tokens=M, greedy=True),
        SamplingParams(max_new_tokens=M, temperature=1.0, top_k=5),
    ):
        a = one.generate(PROMPTS[:1], params, num_generations=1, key=jax.random.key(4))
        b = one.generate(PROMPTS[:2], params, num_generations=1, key=jax.random.key(4))
        assert len(a) == 1 and a.info["batch_rows"] == 2
        np.testing.assert_array_equal(a.completion_ids, b.completion_ids[:1])
        np.testing.assert_allclose(a.logprobs, b.logprobs[:1], atol=1e-5)


def test_a_prompt_that_fails_to_encode_on_one_process_stops_every_process(monkeypatch, model, tok):
    """With several processes, a prompt that failed to encode (an id past the vocabulary,
    an empty encoding) raised on its process alone, before the gather of the prompt
    counts: the others waited there until the distributed runtime aborted them all. Now
    the failure travels in that gather: its process raises its own error, the others
    one naming it. (Two processes faked: the gather returns this row and a peer's.)"""
    from gdpo_jax.sampling import hostio

    mesh = jax.make_mesh((1, 1, 1), ("data", "fsdp", "tensor"))
    s = Sampler(model, tok, mesh=mesh, eos_token_ids=())
    peer_failed, gathered = [False], []

    def allgather(x):
        gathered.append(np.asarray(x).copy())
        peer = np.array([1, 1, 3, peer_failed[0]], np.int64)
        return np.stack([np.asarray(x), peer])

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(hostio, "row_block", lambda mesh, axes: (0, 2))
    monkeypatch.setattr(hostio, "allgather", allgather)
    params = SamplingParams(max_new_tokens=2)
    bad = [[5, model.cfg.vocab_size]]  # an id past the vocabulary, this process only
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        s.generate(bad, params, key=jax.random.key(0))
    assert len(gathered) == 1 and gathered[0][3] == 1  # the peers learnt it first
    peer_failed[0] = True  # this process's prompts are fine; a peer's failed
    with pytest.raises(ValueError, match="failed to encode on another process"):
        s.generate([[5, 6]], params, key=jax.random.key(0))
