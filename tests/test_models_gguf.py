"""GGUF loading: a synthetic llama.cpp-style file vs PyTorch, and the real SmolLM2."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from gdpo_jax.models import load_pretrained  # noqa: E402
from gdpo_jax.models.gguf import find_known_gguf  # noqa: E402

SMOL = "smollm2-135m-instruct"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute, copied independently of ours."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _write_gguf(tmodel, path: str, extra: dict | None = None, meta=None) -> None:
    """`tmodel` as a llama GGUF (its mlp tensors Q8_0), with `extra` tensors and
    `meta(writer)` adding metadata."""
    c = tmodel.config
    w = gguf.GGUFWriter(path, "llama")
    if meta is not None:
        meta(w)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in tmodel.state_dict().items()}
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    sub = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for k, a in sd.items():
        if k in names:
            w.add_tensor(names[k], a)
            continue
        _, _, i, rest = k.split(".", 3)
        mod = rest.rsplit(".", 1)[0]
        if mod == "self_attn.q_proj":
            a = llama_cpp_permute(a, c.num_attention_heads)
        elif mod == "self_attn.k_proj":
            a = llama_cpp_permute(a, c.num_key_value_heads)
        name = f"blk.{i}.{sub[mod]}.weight"
        if mod.startswith("mlp."):  # a quantized tensor, as in real files
            w.add_tensor(
                name,
                gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                raw_dtype=gguf.GGMLQuantizationType.Q8_0,
            )
        else:
            w.add_tensor(name, a)
    for name, a in (extra or {}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_synthetic_gguf_matches_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("GDPO_JAX_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=1000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    tmodel = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in tmodel.named_parameters():
            p.copy_((1.0 if "norm" in name else 0.0) + 0.2 * torch.randn_like(p))
            if ".mlp." in name:  # the reference sees the Q8_0-rounded weights
                q = gguf.quants.quantize(p.numpy(), gguf.GGMLQuantizationType.Q8_0)
                p.copy_(torch.from_numpy(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)))
    path = str(tmp_path / "tiny.gguf")
    _write_gguf(tmodel, path)
    model, tok = load_pretrained(path)
    assert tok is None and model.cfg.num_kv_heads == 2 and not model.cfg.tie_word_embeddings
    ids = np.random.RandomState(0).randint(0, 96, (2, 7)).astype(np.int32)
    with torch.no_grad():
        ref = tmodel(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    ours = np.asarray(jax.jit(lambda m, i: m(i))(model, ids))
    np.testing.assert_allclose(ours, ref, atol=1e-4)
    # Second load comes from the converted cache: no conversion runs (a second one
    # into a temporary directory, then discarded, would also leave one entry).
    assert len(os.listdir(tmp_path / "cache")) == 1
    from gdpo_jax.models import gguf as gguf_lib

    def no_conversion(*a, **k):
        raise AssertionError("converted again instead of reading the cache")

    monkeypatch.setattr(gguf_lib, "convert_gguf", no_conversion)
    load_pretrained(path)
    assert len(os.listdir(tmp_path / "cache")) == 1
    # A fixed converter (its version bumped) does not reuse the earlier conversion: the
    # cache was keyed on the file alone, so a fix never reached converted models.
    monkeypatch.undo()
    monkeypatch.setenv("GDPO_JAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_lib, "CONVERTER_VERSION", gguf_lib.CONVERTER_VERSION + 1)
    converted = []
    real = gguf_lib.convert_gguf
    monkeypatch.setattr(gguf_lib, "convert_gguf", lambda *a: converted.append(a) or real(*a))
    load_pretrained(path)
    assert len(converted) == 1 and len(os.listdir(tmp_path / "cache")) == 2


def _tiny_llama():
    cfg = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=32,  # Q8_0 blocks of 32 (mlp tensors are quantized)
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        rope_theta=1000.0,
        eos_token_id=2,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize(
    "name,match",
    [
        # Llama 3.1+ GGUFs store llama3 RoPE scaling as this top-level tensor.
        ("rope_freqs.weight", r"'rope_freqs\.weight' holds llama3 RoPE scaling.*not supported"),
        ("some_adapter.weight", r"Unexpected GGUF tensor 'some_adapter\.weight'"),
        ("blk.0.attn_sinks.weight", r"Unexpected GGUF tensor 'blk\.0\.attn_sinks\.weight'"),
    ],
)
def test_gguf_tensor_without_an_hf_name_is_named(tmp_path, monkeypatch, name, match):
    monkeypatch.setenv("GDPO_JAX_CACHE", str(tmp_path / "cache"))
    path = str(tmp_path / "extra.gguf")
    _write_gguf(_tiny_llama(), path, {name: np.ones(4, np.float32)})
    with pytest.raises(ValueError, match=match):
        load_pretrained(path)


def test_a_bad_gguf_file_is_one_line_naming_it(tmp_path, monkeypatch):
    # The reader's own errors named no file: "cannot reshape array of size 2408640 into
    # shape (49152,612)" for a cut download, "GGUF magic invalid", a bare IndexError.
    monkeypatch.setenv("GDPO_JAX_CACHE", str(tmp_path / "cache"))
    good = tmp_path / "good.gguf"
    _write_gguf(_tiny_llama(), str(good))
    data = good.read_bytes()
    cases = {
        "tail.gguf": (data[:-64], "is not a readable GGUF"),
        "head.gguf": (data[:1000], "is not a readable GGUF"),
        "text.gguf": (b"not a model\n" * 10, "is not a readable GGUF"),
        "empty.gguf": (b"", "is empty"),
    }
    for name, (content, what) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=rf"GGUF file '.*{name}' {what}") as e:
            load_pretrained(str(tmp_path / name))
        assert "\n" not in str(e.value) and "download it again" in str(e.value)


def test_gguf_metadata_missing_a_required_key_names_it(tmp_path):
    from gdpo_jax.models.gguf import convert_gguf

    path = str(tmp_path / "meta.gguf")

    def write(*adds, tensor=False):
        w = gguf.GGUFWriter(path, "llama")
        for add, value in adds:
            getattr(w, f"add_{add}")(value)
        if tensor:
            w.add_tensor("output.weight", np.zeros((32, 64), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    # No block_count, and no vocab size, token list or embedding.
    write(("embedding_length", 64), ("feed_forward_length", 128), ("head_count", 8), tensor=True)
    with pytest.raises(ValueError, match=r"meta\.gguf': the GGUF gives no vocabulary size"):
        convert_gguf(path, str(tmp_path / "out"))
    write(("embedding_length", 64), ("head_count", 8), ("vocab_size", 32))
    with pytest.raises(ValueError, match=r"lacks the required metadata key 'llama\.feed_forward"):
        convert_gguf(path, str(tmp_path / "out"))


def test_gguf_end_of_turn_ids_are_stop_ids(tmp_path, monkeypatch):
    # llama.cpp stops at tokenizer.ggml.eot_token_id (Llama 3 Instruct: <|eot_id|>,
    # beside eos <|end_of_text|>); the conversion kept eos alone, so the sampler ran on.
    monkeypatch.setenv("GDPO_JAX_CACHE", str(tmp_path / "cache"))

    def stops(w):
        w.add_eos_token_id(2)
        w.add_uint32("tokenizer.ggml.eot_token_id", 7)
        w.add_uint32("tokenizer.ggml.eom_token_id", 2)  # the eos again: listed once

    path = str(tmp_path / "eot.gguf")
    _write_gguf(_tiny_llama(), path, meta=stops)
    model, _ = load_pretrained(path)
    assert model.cfg.eos_token_ids == (2, 7)
    plain = str(tmp_path / "plain.gguf")
    _write_gguf(_tiny_llama(), plain, meta=lambda w: w.add_eos_token_id(2))
    assert load_pretrained(plain)[0].cfg.eos_token_ids == (2,)


def test_gguf_with_a_pre_tokenizer_the_conversion_cannot_split_for_is_refused(
    tmp_path, monkeypatch
):
    # deepseek-llm's rule puts every newline in a piece of its own; the conversion split
    # its text as GPT-2 does ('ĊĊ' where llama.cpp gives 'Ċ', 'Ċ'), without a word.
    monkeypatch.setenv("GDPO_JAX_CACHE", str(tmp_path / "cache"))

    def pre(w):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("deepseek-llm")

    path = str(tmp_path / "pre.gguf")
    _write_gguf(_tiny_llama(), path, meta=pre)
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.pre='deepseek-llm'.*smollm") as e:
        load_pretrained(path)
    assert "\n" not in str(e.value)
    assert not os.listdir(tmp_path / "cache") or all(
        n.startswith(".") for n in os.listdir(tmp_path / "cache")
    )


def test_an_upper_case_gguf_suffix_is_a_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("GDPO_JAX_CACHE", str(tmp_path / "cache"))
    path = str(tmp_path / "Tiny.GGUF")
    _write_gguf(_tiny_llama(), path)
    assert load_pretrained(path)[0].cfg.num_layers == 1


@pytest.fixture(scope="module")
def smol():
    try:
        find_known_gguf(SMOL)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return load_pretrained(SMOL)


def _greedy(model, ids: list[int], max_new: int, eos: int) -> list[int]:
    cache = model.init_cache(1, len(ids) + max_new)
    step = jax.jit(lambda m, x, c: m(x, cache=c))
    logits, cache = step(model, jnp.asarray([ids], jnp.int32), cache)
    out = []
    for _ in range(max_new):
        nxt = int(jnp.argmax(logits[0, -1]))
        out.append(nxt)
        if nxt == eos:
            break
        logits, cache = step(model, jnp.asarray([[nxt]], jnp.int32), cache)
    return out


@pytest.mark.slow
def test_smollm2_answers_capital_of_france(smol):
    model, tok = smol
    cfg = model.cfg
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.hidden_size) == (30, 9, 3, 576)
    assert cfg.tie_word_embeddings and cfg.vocab_size == 49152
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    ids = tok(text, add_special_tokens=False).input_ids
    answer = tok.decode(_greedy(model, ids, 16, tok.eos_token_id), skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.mark.slow
def test_smollm2_matches_transformers_gguf_loader(smol):
    """transformers' own GGUF reader (PyTorch) is an independent dequant + unpermute."""
    model, tok = smol
    path = find_known_gguf(SMOL)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path),
        gguf_file=os.path.basename(path),
        local_files_only=True,
        dtype=torch.float32,
    ).eval()
    ids = np.asarray(
        [tok("The capital of Italy is Rome, and the capital of Spain").input_ids], np.int32
    )
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    ours = np.asarray(jax.jit(lambda m, i: m(i))(model, ids))
    # 30 layers, logits up to ~30: allow f32 accumulation-order noise.
    np.testing.assert_allclose(ours, ref, atol=2e-3)
    assert np.array_equal(ours.argmax(-1), ref.argmax(-1))


def test_smollm2_tokenizer_splits_every_digit_as_llama_cpp_does(smol):
    # The GGUF's tokenizer.ggml.pre is "smollm": llama.cpp splits off each number
    # character before the GPT-2 regex. transformers' GGUF reader did not, so spaces or a
    # newline before a number tokenized differently from what the model was trained on.
    # Hand-worked from llama.cpp's rule: "\p{N}" pieces first, then the GPT-2 regex,
    # whose "\s+(?!\S)" keeps a run of spaces whole.
    _, tok = smol

    def pieces(text: str) -> list[str]:
        return tok.convert_ids_to_tokens(tok(text, add_special_tokens=False).input_ids)

    assert pieces("Total:    42") == ["Total", ":", "ĠĠĠĠ", "4", "2"]
    assert pieces("Steps:\n  1. add") == ["Steps", ":", "ĊĠĠ", "1", ".", "Ġadd"]
    assert pieces("What is 12 + 345?") == [
        "What",
        "Ġis",
        "Ġ",
        "1",
        "2",
        "Ġ+",
        "Ġ",
        "3",
        "4",
        "5",
        "?",
    ]


def _config_of(tmp_path, meta) -> dict:
    """gguf_hf_config of a metadata-only llama GGUF (8 heads of 8) with `meta(writer)`."""
    from gdpo_jax.models.gguf import gguf_hf_config

    path = str(tmp_path / "meta.gguf")
    w = gguf.GGUFWriter(path, "llama")
    for add, v in (("block_count", 1), ("embedding_length", 64), ("feed_forward_length", 128)):
        getattr(w, f"add_{add}")(v)
    w.add_head_count(8)
    w.add_vocab_size(32)
    meta(w)
    w.add_tensor("output.weight", np.zeros((32, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return gguf_hf_config(gguf.GGUFReader(path))


def test_gguf_rope_keys_as_llama_cpp_reads_them(tmp_path):
    """RoPE metadata llama.cpp honours: the scaling factor under its current key or the
    older rope.scale_linear, the type linear unless named; a partial rotary dimension
    count is refused, not ignored (it rotated every dimension)."""
    assert "rope_scaling" not in _config_of(tmp_path, lambda w: None)
    cfg = _config_of(tmp_path, lambda w: w.add_rope_scaling_factor(4.0))  # type not named
    assert cfg["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}
    cfg = _config_of(tmp_path, lambda w: w.add_float32("llama.rope.scale_linear", 2.0))
    assert cfg["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    for factor in (0.0, 1.0):  # llama.cpp: no scaling
        cfg = _config_of(tmp_path, lambda w, f=factor: w.add_rope_scaling_factor(f))
        assert "rope_scaling" not in cfg

    def none_type(w):
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
        w.add_rope_scaling_factor(4.0)

    assert "rope_scaling" not in _config_of(tmp_path, none_type)

    def yarn(w):
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)

    with pytest.raises(ValueError, match="rope scaling 'yarn' is not supported"):
        _config_of(tmp_path, yarn)
    assert _config_of(tmp_path, lambda w: w.add_rope_dimension_count(8))["head_dim"] == 8
    with pytest.raises(ValueError, match=r"rope\.dimension_count=4 rotates part of each 8-dim"):
        _config_of(tmp_path, lambda w: w.add_rope_dimension_count(4))
    # attn_factor scales cos and sin in llama.cpp: it was read by nobody, so dropped.
    assert "rope_scaling" not in _config_of(
        tmp_path, lambda w: w.add_float32("llama.rope.scaling.attn_factor", 1.0)
    )
    with pytest.raises(ValueError, match=r"rope\.scaling\.attn_factor=0\.5 .* not supported"):
        _config_of(tmp_path, lambda w: w.add_float32("llama.rope.scaling.attn_factor", 0.5))
