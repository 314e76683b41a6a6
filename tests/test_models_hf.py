"""Parity with transformers' PyTorch models; HF checkpoint loading, export, bad input."""

import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gdpo_jax.models import ModelConfig, load_pretrained, save_pretrained  # noqa: E402
from gdpo_jax.models.export import write_safetensors  # noqa: E402
from gdpo_jax.models.loading import SafetensorsDir  # noqa: E402
from gdpo_jax.models.sharding import abstract_model  # noqa: E402
from tests._tiny_tokenizer import make_tiny_tokenizer  # noqa: E402

V = 128
COMMON = dict(
    vocab_size=V,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
HF_CONFIGS = {
    # llama3 rope scaling with a short original context so it changes the angles.
    "llama": lambda: transformers.LlamaConfig(
        **COMMON,
        rope_theta=500.0,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "qwen2": lambda: transformers.Qwen2Config(
        **COMMON, rope_theta=1000.0, tie_word_embeddings=False
    ),
    # head_dim 24 != hidden/heads = 16; tied embeddings.
    "qwen3": lambda: transformers.Qwen3Config(
        **COMMON, head_dim=24, rope_theta=1000.0, tie_word_embeddings=True
    ),
}


def _torch_model(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(HF_CONFIGS[kind]())
    model.eval()
    with torch.no_grad():  # random norms and biases too, so each is exercised
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model


def _batch(B=3, T=9, seed=0):
    rs = np.random.RandomState(seed)
    ids = rs.randint(3, V, (B, T)).astype(np.int32)
    lens = np.array([T, T - 4, 2])[:B]
    mask = (np.arange(T)[None, :] >= T - lens[:, None]).astype(np.int32)
    ids[mask == 0] = 0
    return ids, mask


def _torch_logits(model, ids, mask):
    pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(pos, dtype=torch.long),
        )
    return out.logits.float().numpy()


def _assert_close_valid(a, b, mask, atol=1e-4):
    valid = np.asarray(mask, bool)  # padded query rows are unspecified
    diff = np.abs(np.asarray(a)[valid] - np.asarray(b)[valid]).max()
    assert diff <= atol, f"max abs diff {diff:.3g} on non-padded positions"
    assert np.abs(np.asarray(b)[valid]).max() > 0.1  # logits are not trivially tiny


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    out = {}
    for kind in HF_CONFIGS:
        d = str(tmp_path_factory.mktemp(kind))
        model = _torch_model(kind)
        model.save_pretrained(d)
        out[kind] = (d, model)
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_loaded_logits_match_transformers(hf_dirs, kind):
    d, tmodel = hf_dirs[kind]
    model, tok = load_pretrained(d)
    assert tok is None  # no tokenizer files in this dir
    cfg = model.cfg
    assert cfg.model_type == kind
    assert cfg.attention_bias == (kind == "qwen2") and cfg.qk_norm == (kind == "qwen3")
    assert cfg.tie_word_embeddings == (kind == "qwen3")
    ids, mask = _batch()
    ours = jax.jit(lambda m, i, k: m(i, k))(model, ids, mask)
    _assert_close_valid(ours, _torch_logits(tmodel, ids, mask), mask)


def test_export_roundtrip_loads_in_transformers(hf_dirs, tmp_path):
    tok = make_tiny_tokenizer(V)
    for kind in ("llama", "qwen3"):
        model, _ = load_pretrained(hf_dirs[kind][0])
        out = save_pretrained(model, tok, str(tmp_path / kind))
        files = set(os.listdir(out))
        assert {
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer_config.json",
        } <= files
        back = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
        back.eval()
        ids, mask = _batch(seed=1)
        ours = jax.jit(lambda m, i, k: m(i, k))(model, ids, mask)
        _assert_close_valid(ours, _torch_logits(back, ids, mask), mask)
        tok2 = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
        assert tok2("w7 w9").input_ids == tok("w7 w9").input_ids
    # ... and back into ours (with the tokenizer) from a multi-file sharded export.
    again = save_pretrained(model, tok, str(tmp_path / "sharded"), max_shard_bytes=20_000)
    assert os.path.exists(os.path.join(again, "model.safetensors.index.json"))
    model2, tok3 = load_pretrained(again)
    assert tok3 is not None and tok3.eos_token_id == 2
    a = jax.tree.leaves(jax.tree.map(np.asarray, model.param_arrays()))
    b = jax.tree.leaves(jax.tree.map(np.asarray, model2.param_arrays()))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_load_sharded_into_mesh_bf16(hf_dirs):
    """Loading onto a mesh places each tensor directly in its shards."""
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
    model, _ = load_pretrained(hf_dirs["qwen2"][0], mesh=mesh)
    q = model.layers.q_proj.get_value()
    assert q.sharding.spec == jax.P(None, "fsdp", "tensor")
    assert q.addressable_shards[0].data.shape == (2, 32, 32)
    ids, mask = _batch()
    with jax.set_mesh(mesh):
        ours = jax.jit(lambda m, i, k: m(i, k))(model, ids, mask)
    _assert_close_valid(ours, _torch_logits(hf_dirs["qwen2"][1], ids, mask), mask)
    bf, _ = load_pretrained(hf_dirs["qwen2"][0], param_dtype="bfloat16", dtype="bfloat16")
    assert bf.layers.q_proj.get_value().dtype == jax.numpy.bfloat16


# ---------------------------------------------------------------- bad input
def _copy_ckpt(
    src: str,
    dst: str,
    drop: str | None = None,
    reshape: str | None = None,
    config_edit: dict | None = None,
    add: dict | None = None,
) -> str:
    os.makedirs(dst, exist_ok=True)
    reader = SafetensorsDir(src)
    tensors = {k: np.array(reader[k]) for k in reader.entries if k != drop}
    if reshape:
        tensors[reshape] = tensors[reshape][:-1]
    tensors.update(add or {})
    write_safetensors(tensors, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(config_edit or {})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return dst


def test_missing_tensor_is_named(hf_dirs, tmp_path):
    name = "model.layers.1.self_attn.k_proj.weight"
    d = _copy_ckpt(hf_dirs["llama"][0], str(tmp_path / "m"), drop=name)
    with pytest.raises(ValueError, match=r"missing 1 tensor.*layers\.1\.self_attn\.k_proj"):
        load_pretrained(d)


def test_wrong_shape_names_tensor_and_both_shapes(hf_dirs, tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    d = _copy_ckpt(hf_dirs["llama"][0], str(tmp_path / "s"), reshape=name)
    with pytest.raises(ValueError, match=r"up_proj.*\(95, 64\).*\(96, 64\)"):
        load_pretrained(d)


def test_a_cut_or_corrupt_safetensors_file_is_one_line_naming_it(hf_dirs, tmp_path):
    # A half-downloaded file read as "cannot reshape array of size 0 into shape (64,128)",
    # a damaged header as a bare JSONDecodeError: neither named the file.
    src = os.path.join(hf_dirs["llama"][0], "model.safetensors")
    data = open(src, "rb").read()
    n = int.from_bytes(data[:8], "little")
    cases = {
        "half": (data[: len(data) // 2], r"truncated safetensors file \(its header needs \d+"),
        "header": (data[: 8 + n // 2], r"not a readable safetensors file"),
        "garbage": (data[:8] + b"#" * n + data[8 + n :], r"not a readable safetensors file"),
        "tiny": (b"abc", r"not a readable safetensors file \(its 3-byte"),
    }
    for name, (content, match) in cases.items():
        d = _copy_ckpt(hf_dirs["llama"][0], str(tmp_path / name))
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(content)
        with pytest.raises(ValueError, match=rf"{name}/model\.safetensors: {match}") as e:
            load_pretrained(d)
        assert "\n" not in str(e.value)


def test_a_tokenizer_that_does_not_load_is_named_not_taken_for_none(hf_dirs, tmp_path):
    # A damaged tokenizer.json was a warning and tokenizer=None: the run then said the
    # checkpoint "came without a tokenizer (no tokenizer.json ...)", the file being there.
    model, _ = load_pretrained(hf_dirs["llama"][0])
    out = str(tmp_path / "out")
    save_pretrained(model, make_tiny_tokenizer(V), out)
    path = os.path.join(out, "tokenizer.json")
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text[: len(text) // 2])
    with pytest.raises(ValueError, match=r"the tokenizer files in '.*out' do not load") as e:
        load_pretrained(out)
    assert "\n" not in str(e.value)


def test_an_export_keeps_the_sources_generation_config(hf_dirs, tmp_path):
    """Qwen2.5-Instruct keeps its pad id and sampling defaults only in
    generation_config.json: load -> export wrote the ids of config.json alone, and
    transformers' generate() on the export decoded greedily without a pad id."""
    src = _copy_ckpt(hf_dirs["qwen2"][0], str(tmp_path / "src"), config_edit={"pad_token_id": None})
    gen = {
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "pad_token_id": 3,
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.05,
        "transformers_version": "4.37.0",
    }
    with open(os.path.join(src, "generation_config.json"), "w") as f:
        json.dump(gen, f)
    model, _ = load_pretrained(src)
    assert model.cfg.pad_token_id == 3
    out = save_pretrained(model, None, str(tmp_path / "out"))
    with open(os.path.join(out, "generation_config.json")) as f:
        got = json.load(f)
    assert {k: got.get(k) for k in ("do_sample", "temperature", "top_p", "top_k")} == {
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
    }
    assert got["repetition_penalty"] == 1.05 and got["pad_token_id"] == 3
    assert set(got["eos_token_id"]) >= {2, 3} and "transformers_version" not in got
    import transformers

    hf = transformers.GenerationConfig.from_pretrained(out)
    assert (hf.pad_token_id, hf.temperature, hf.do_sample) == (3, 0.7, True)


@pytest.mark.parametrize("bad", [0, -5, None, "2GB", True])
def test_export_refuses_a_bad_shard_size_before_writing(hf_dirs, tmp_path, bad):
    # 0 wrote one tensor per file; None and "2GB" failed comparing an int with them.
    model, _ = load_pretrained(hf_dirs["llama"][0])
    with pytest.raises(ValueError, match=r"max_shard_bytes=.* must be a positive int"):
        save_pretrained(model, None, str(tmp_path / "out"), max_shard_bytes=bad)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match=r"dtype='float64' is not a supported export dtype"):
        save_pretrained(model, None, str(tmp_path / "out"), dtype="float64")


def test_a_second_safetensors_file_beside_model_safetensors_is_not_read(hf_dirs, tmp_path):
    # A PEFT adapter_model.safetensors beside model.safetensors was read as weights and
    # refused the dir (transformers reads model.safetensors alone).
    d = _copy_ckpt(hf_dirs["llama"][0], str(tmp_path / "m"))
    write_safetensors(
        {"base_model.model.lm_head.lora_A.weight": np.zeros((4, 64), np.float32)},
        os.path.join(d, "adapter_model.safetensors"),
    )
    model, _ = load_pretrained(d)
    ref, _ = load_pretrained(hf_dirs["llama"][0])
    np.testing.assert_array_equal(
        np.asarray(model.layers.q_proj.get_value()), np.asarray(ref.layers.q_proj.get_value())
    )


def test_unknown_model_type_is_named(hf_dirs, tmp_path):
    d = _copy_ckpt(hf_dirs["llama"][0], str(tmp_path / "u"), config_edit={"model_type": "mamba"})
    with pytest.raises(ValueError, match=r"'mamba'.*llama.*qwen2.*qwen3"):
        load_pretrained(d)
    with pytest.raises(FileNotFoundError, match="not-a-model"):
        load_pretrained("not-a-model")


def test_from_hf_reads_transformers_config(hf_dirs):
    cfg = ModelConfig.from_hf(hf_dirs["llama"][0])
    assert cfg.rope_scaling_dict()["rope_type"] == "llama3" and cfg.rope_theta == 500.0
    assert ModelConfig.from_hf(hf_dirs["qwen3"][0]).head_dim == 24


def test_generation_config_eos_ids_are_read(hf_dirs, tmp_path):
    # Qwen2.5/Qwen3-Instruct: config.json has one EOS, generation_config.json lists two.
    d = _copy_ckpt(hf_dirs["qwen2"][0], str(tmp_path / "g"), config_edit={"eos_token_id": 2})
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [5, 2], "pad_token_id": 0}, f)
    cfg = ModelConfig.from_hf(d)
    assert cfg.eos_token_ids == (2, 5)
    model, _ = load_pretrained(d)
    assert model.cfg.eos_token_ids == (2, 5)
    # The sampler stops on either id (its default EOS set comes from the model config).
    from gdpo_jax.sampling import Sampler

    assert set(Sampler(model, None).eos_token_ids) == {2, 5}
    # No generation_config: config.json's alone.
    os.remove(os.path.join(d, "generation_config.json"))
    assert ModelConfig.from_hf(d).eos_token_ids == (2,)


def test_damaged_generation_config_is_named(hf_dirs, tmp_path):
    d = _copy_ckpt(hf_dirs["qwen2"][0], str(tmp_path / "b"))
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        f.write('{"eos_token_id": [5,')
    with pytest.raises(ValueError, match=r"generation_config.json.*fix or remove"):
        ModelConfig.from_hf(d)


@pytest.mark.parametrize(
    "dtype", ["bfloat16", jax.numpy.bfloat16, np.dtype("float32"), np.float16], ids=str
)
def test_dtypes_as_users_write_them(hf_dirs, dtype):
    model, _ = load_pretrained(hf_dirs["qwen2"][0], dtype=dtype, param_dtype=dtype)
    want = np.dtype(dtype).name
    assert model.cfg.dtype == want and model.cfg.param_dtype == want
    assert model.layers.q_proj.get_value().dtype == np.dtype(dtype)


def test_unsupported_dtype_is_named():
    with pytest.raises(ValueError, match=r"param_dtype=.*int32.*float32"):
        ModelConfig.tiny(param_dtype=np.int32)


# ------------------------------------------------- exports into a used dir, dtypes
def _fwd(model, ids, mask):
    return jax.jit(lambda m, i, k: m(i, k))(model, ids, mask)


def _single_or_sharded(n: int) -> dict:
    return {"max_shard_bytes": 20_000} if n > 1 else {}


@pytest.mark.parametrize("first,second", [(2, 1), (1, 2)], ids=["sharded-then-single", "single"])
def test_export_into_an_earlier_export_replaces_its_weight_files(hf_dirs, tmp_path, first, second):
    # sharded then single: our loader read the stale index (the old weights);
    # single then sharded: transformers read the stale model.safetensors.
    old, _ = load_pretrained(hf_dirs["qwen2"][0])
    new, _ = load_pretrained(hf_dirs["qwen2"][0])
    new.embed.set_value(new.embed.get_value() * 0.5)
    out = str(tmp_path / "out")
    save_pretrained(old, None, out, **_single_or_sharded(first))
    save_pretrained(new, None, out, **_single_or_sharded(second))
    weights = sorted(f for f in os.listdir(out) if f.startswith("model"))
    if second == 1:
        assert weights == ["model.safetensors"]
    else:
        assert "model.safetensors" not in weights and "model.safetensors.index.json" in weights
    ids, mask = _batch()
    want = _fwd(new, ids, mask)
    back = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    _assert_close_valid(want, _torch_logits(back, ids, mask), mask)
    ours, _ = load_pretrained(out)
    _assert_close_valid(want, _fwd(ours, ids, mask), mask)


def test_export_into_an_earlier_export_replaces_its_tokenizer_files(hf_dirs, tmp_path, caplog):
    # The earlier export's tokenizer stayed beside weights exported without one, and was
    # loaded with them as this model's tokenizer.
    model, _ = load_pretrained(hf_dirs["qwen2"][0])
    out = str(tmp_path / "out")
    save_pretrained(model, make_tiny_tokenizer(V), out)
    (tmp_path / "out" / "merges.txt").write_text("#version: 0.2\n")  # another kind's file
    assert "tokenizer.json" in os.listdir(out)
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.models.export"):
        save_pretrained(model, None, out)
    assert sorted(os.listdir(out)) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    assert "removed an earlier export's tokenizer files" in caplog.text
    assert "merges.txt" in caplog.text
    assert load_pretrained(out)[1] is None


def test_an_export_killed_before_its_end_has_no_config_json(hf_dirs, tmp_path):
    # config.json was written before the tokenizer files, so an export killed in between
    # (or a re-export killed before its end, the earlier config.json still there) looked
    # complete: a warm start skipped its SFT and loaded weights without a tokenizer.
    model, _ = load_pretrained(hf_dirs["qwen2"][0])
    out = str(tmp_path / "out")
    tok = make_tiny_tokenizer(V)
    save_pretrained(model, tok, out)
    assert "config.json" in os.listdir(out)

    class Killed(Exception):
        pass

    def killed(*a, **k):
        raise Killed

    tok.save_pretrained = killed
    with pytest.raises(Killed):
        save_pretrained(model, tok, out)
    assert "config.json" not in os.listdir(out)


def test_loader_refuses_a_dir_with_both_weight_layouts(hf_dirs, tmp_path):
    model, _ = load_pretrained(hf_dirs["qwen2"][0])
    d = save_pretrained(model, None, str(tmp_path / "both"), max_shard_bytes=20_000)
    shutil.copy(os.path.join(hf_dirs["qwen2"][0], "model.safetensors"), d)
    with pytest.raises(ValueError, match=r"both model\.safetensors and model\.safetensors\.index"):
        load_pretrained(d)
    # Shards left without their index beside model.safetensors: a tensor in two files.
    os.remove(os.path.join(d, "model.safetensors.index.json"))
    with pytest.raises(ValueError, match=r"in more than one file"):
        load_pretrained(d)


@pytest.mark.parametrize(
    "dtype", [jax.numpy.bfloat16, np.float16, np.dtype("float32"), "bfloat16"], ids=str
)
def test_export_dtype_as_users_write_it(hf_dirs, tmp_path, dtype):
    model, _ = load_pretrained(hf_dirs["qwen2"][0])
    out = save_pretrained(model, None, str(tmp_path / "d"), dtype=dtype)
    name = np.dtype(dtype).name
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["torch_dtype"] == name
    with open(os.path.join(out, "model.safetensors"), "rb") as f:  # read the header by hand
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    st = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[name]
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {st}
    back = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert back.model.embed_tokens.weight.dtype == getattr(torch, name)


def test_export_with_a_bad_dtype_writes_nothing(hf_dirs, tmp_path):
    model, _ = load_pretrained(hf_dirs["qwen2"][0])
    out = tmp_path / "never"
    with pytest.raises(ValueError, match=r"dtype=.*int32.*not a supported export dtype"):
        save_pretrained(model, None, str(out), dtype=np.int32)
    assert not out.exists()


def _random_model(cfg: ModelConfig, seed: int = 1):
    """Random weights, norms and biases (a dropped one shows in the logits)."""
    rs = np.random.RandomState(seed)
    graphdef, state = nnx.split(abstract_model(cfg))
    flat = []
    for path, var in nnx.to_flat_state(state):
        v, name = var.get_value(), str(path[-1])
        base, scale = (1.0, 0.3) if "norm" in name else (0.0, 0.3 if "bias" in name else 0.1)
        flat.append(
            (path, var.replace(jax.numpy.asarray(base + scale * rs.randn(*v.shape), v.dtype)))
        )
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_tiny_model_of_a_type_exports_what_transformers_runs(tmp_path, kind):
    # ModelConfig.tiny(model_type="qwen3") had no q/k norm (qwen2: no bias), which
    # the exported config.json could not say.
    cfg = ModelConfig.tiny(vocab_size=V, model_type=kind)
    assert (cfg.attention_bias, cfg.qk_norm) == (kind == "qwen2", kind == "qwen3")
    model = _random_model(cfg)
    out = save_pretrained(model, None, str(tmp_path / kind))
    ids, mask = _batch()
    want = _fwd(model, ids, mask)
    back = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    _assert_close_valid(want, _torch_logits(back, ids, mask), mask)
    ours, _ = load_pretrained(out)
    assert ours.cfg == cfg
    _assert_close_valid(want, _fwd(ours, ids, mask), mask)


def test_llama_attention_bias_in_transformers_includes_o_proj():
    # Why ModelConfig refuses to export llama with attention_bias: HF's flag also adds
    # an o_proj bias, which this model does not have.
    hf = transformers.LlamaConfig(**COMMON, attention_bias=True)
    names = set(transformers.AutoModelForCausalLM.from_config(hf).state_dict())
    assert "model.layers.0.self_attn.o_proj.bias" in names


# ------------------------------------------------- checkpoint tensors the config does not use
def test_qwen2_config_saying_no_attention_bias_still_has_it(hf_dirs, tmp_path):
    # transformers' Qwen2 has q/k/v bias whatever config.json says; we dropped them.
    d = _copy_ckpt(hf_dirs["qwen2"][0], str(tmp_path / "q"), config_edit={"attention_bias": False})
    ref = transformers.AutoModelForCausalLM.from_pretrained(d, local_files_only=True).eval()
    model, _ = load_pretrained(d)
    assert model.cfg.attention_bias
    ids, mask = _batch()
    _assert_close_valid(_fwd(model, ids, mask), _torch_logits(ref, ids, mask), mask)


@pytest.mark.parametrize(
    "kind,edit,name",
    [
        ("qwen3", {"model_type": "llama"}, "model.layers.0.self_attn.k_norm.weight"),
        ("llama", {"num_hidden_layers": 1}, "model.layers.1.input_layernorm.weight"),
        ("qwen2", {"model_type": "llama"}, "model.layers.0.self_attn.k_proj.bias"),
    ],
    ids=["qk-norm", "extra-layer", "bias"],
)
def test_checkpoint_tensors_the_config_does_not_use_are_refused(
    hf_dirs, tmp_path, kind, edit, name
):
    d = _copy_ckpt(hf_dirs[kind][0], str(tmp_path / "u"), config_edit=edit)
    with pytest.raises(ValueError, match=rf"does not use .*{name.replace('.', '[.]')}"):
        load_pretrained(d)


def test_buffers_and_tied_head_copies_load(hf_dirs, tmp_path):
    d, tmodel = hf_dirs["qwen3"]  # tied
    embed = np.array(SafetensorsDir(d)["model.embed_tokens.weight"])
    extra = {
        "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(12, np.float32),
        "lm_head.weight": embed.copy(),
    }
    model, _ = load_pretrained(_copy_ckpt(d, str(tmp_path / "ok"), add=extra))
    ids, mask = _batch()
    _assert_close_valid(_fwd(model, ids, mask), _torch_logits(tmodel, ids, mask), mask)
    # A tied config with a different lm_head: transformers 5 uses that head, 4.x the
    # embedding; refused rather than guessed.
    extra["lm_head.weight"] = embed * -2.0
    with pytest.raises(ValueError, match=r"tie_word_embeddings=true but an lm_head"):
        load_pretrained(_copy_ckpt(d, str(tmp_path / "head"), add=extra))


def test_an_unknown_tensor_dtype_is_named_when_read(tmp_path):
    # Opening a dir with one F8_E4M3 tensor was a bare KeyError('F8_E4M3'), even when
    # only the other tensors were needed.
    ok = np.arange(6, dtype=np.float32).reshape(2, 3)
    header = {
        "ok.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "fp8.weight": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [24, 28]},
    }
    blob = json.dumps(header).encode()
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob + ok.tobytes() + bytes(4))
    reader = SafetensorsDir(str(tmp_path))
    np.testing.assert_array_equal(reader["ok.weight"], ok)
    assert reader.shape("fp8.weight") == (4,)
    with pytest.raises(ValueError, match=r"'fp8.weight' in model.safetensors is stored as F8_E4M3"):
        reader["fp8.weight"]
