"""The ahead-of-time planner (gdpo_jax/scale, experiments/plan.py) on tiny configs.

Compiles for abstract TPU / GPU devices through libtpu and the CUDA plugin
(the `[aot]` extra); those tests skip, naming the extra, only where it is not
installed. References are hand arithmetic written here, not the planner's.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from gdpo_jax.models.config import ModelConfig
from gdpo_jax.scale import flops as flops_lib
from gdpo_jax.scale import targets as targets_lib
from gdpo_jax.train.config import ConfigError, base_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_TPU = targets_lib.has_module("libtpu")
HAS_CUDA = targets_lib.has_module("jax_plugins.xla_cuda12")
needs_tpu = pytest.mark.skipif(not HAS_TPU, reason='needs the [aot] extra: pip install -e ".[aot]"')
needs_cuda = pytest.mark.skipif(
    not HAS_CUDA, reason='needs the [aot] extra: pip install -e ".[aot]"'
)
# Tiny llama, every dim divisible by 4 (so fsdp=4 splits every matrix 4 ways).
D, F, L, HQ, HKV, DH, V = 64, 128, 2, 4, 2, 16, 256


@pytest.fixture(scope="module", autouse=True)
def _libtpu_env():
    """libtpu asks the machine what TPU it is unless told; set only for this module."""
    saved = {k: os.environ.get(k) for k in ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES")}
    os.environ.update(TPU_ACCELERATOR_TYPE="v5litepod-4", TPU_WORKER_HOSTNAMES="localhost")
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def tiny_config(**algo):
    c = base_config()
    c.workdir = "/tmp/unused"
    c.task.name = "toy_toolcall"
    c.model.tokenizer = "toy_words"  # a random-init model names its tokenizer (validation)
    c.rewards.names = ("toy_format", "toy_correct")
    c.model.tiny.update(
        dict(
            hidden_size=D,
            intermediate_size=F,
            num_layers=L,
            num_heads=HQ,
            num_kv_heads=HKV,
            head_dim=DH,
            vocab_size=V,
            max_position_embeddings=256,
        )
    )
    c.algo.num_prompts, c.algo.group_size = 8, 4
    c.algo.old_logprobs = "recompute"
    c.algo.update(algo)
    c.sampling.max_prompt_len, c.sampling.max_new_tokens = 16, 16
    c.mesh.shape = (1, -1, 1)
    return c


def n_matrix() -> int:
    """Weights of the kernels and embeddings (all split over fsdp on this mesh)."""
    q, kv = HQ * DH, HKV * DH
    return L * (D * (q + 2 * kv) + q * D + 3 * D * F) + 2 * V * D


def n_vector() -> int:
    return 2 * L * D + D  # attn / mlp norms per layer + final norm (replicated)


# ----------------------------------------------------------------- no compiler
def test_unknown_topology_lists_the_valid_names():
    with pytest.raises(targets_lib.TargetError) as e:
        targets_lib.parse_target("v9-8")
    msg = str(e.value)
    for name in (
        "v4-8",
        "v5e-16",
        "v5p-64",
        "v6e-8",
        "8xh100",
        "16xh100",
        "8xa100-80g",
        "8xh200",
        "tpu:<topology>",
        "cuda:<slices>x<hosts>x<gpus>",
    ):
        assert name in msg


@pytest.mark.parametrize(
    "name",
    [
        "cuda:0x1x8:h100",
        "cuda:1x1x0:h100",
        "tpu:v5p:0x2x2",
        "tpu:v5p:2x2x0",
        "tpu:v5p:2x2x1,slices=0",
    ],
)
def test_a_topology_with_a_count_of_0_or_the_wrong_dimensions_is_one_line(name):
    # A 0-device target failed in validation with ZeroDivisionError.
    with pytest.raises(targets_lib.TargetError, match=r"has a count of 0; every slice") as e:
        targets_lib.parse_target(name)
    assert "\n" not in str(e.value)
    # v5e and v6e slices are 2-D tori, v4 and v5p 3-D: libtpu compiled for the others too.
    for bad, want in (("tpu:v5e:2x2x2", "2-D"), ("tpu:v6e:4x4x1", "2-D"), ("tpu:v4:2x2", "3-D")):
        with pytest.raises(targets_lib.TargetError, match=rf"slice is {want}"):
            targets_lib.parse_target(bad)


def test_planner_inputs_that_raised_value_errors_are_one_line(tmp_path):
    # A checkpoint of an unsupported architecture, and a mesh whose data and fsdp axes both
    # miss the slice count, escaped the CLI's handling as tracebacks; the search took such a
    # mesh as a candidate and aborted.
    from gdpo_jax.scale.arch import PlanError, model_config
    from gdpo_jax.scale.search import _valid
    from gdpo_jax.sharding import _multislice_devices

    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    c = tiny_config()
    c.model.name = str(tmp_path)
    with pytest.raises(PlanError, match=r"config\.model\.name=.*gpt2") as e:
        model_config(c)
    assert "\n" not in str(e.value)
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(PlanError, match=r"config\.model\.name="):
        model_config(c)
    with pytest.raises(ConfigError, match=r"config\.mesh\.shape=\(2, 2, 4\): the devices span 4"):
        _multislice_devices((2, 2, 4), 4, [])
    target = targets_lib.parse_target("tpu:v5p:2x2x1,slices=4")  # 16 chips
    c = tiny_config()
    c.mesh.shape = (1, -1, 8)  # data 1, fsdp 2: neither divides over 4 slices
    assert not _valid(c, target)
    c.mesh.shape = (4, -1, 1)  # the slices along data
    assert _valid(c, target)


def test_a_multi_host_target_is_planned_with_the_runs_per_process_checks():
    # One JAX process per host: a run on these targets refuses a tensor axis across the
    # hosts, rows_per_call or num_prompts that do not split over the processes; the plan
    # checked them on this one process and said "fits", and the search offered such meshes.
    from gdpo_jax.scale import plan as plan_lib
    from gdpo_jax.scale.search import _valid

    gpus = targets_lib.parse_target("cuda:1x2x1:h100")  # 2 GPUs, 2 hosts
    assert (gpus.num_devices, gpus.num_hosts) == (2, 2)
    c = tiny_config()
    c.sampling.rows_per_call = c.algo.group_size  # one prompt per call: not per process
    with pytest.raises(ConfigError, match=r"config\.sampling\.rows_per_call=.* over 2 processes"):
        plan_lib.make_plan(c, gpus)
    assert not _valid(c, gpus)
    c = tiny_config()
    c.mesh.shape = (1, 1, -1)  # the tensor axis spans the two hosts
    with pytest.raises(ConfigError, match=r"data x fsdp = 1 do not split over the 2 processes"):
        plan_lib.make_plan(c, gpus)
    v5p = targets_lib.parse_target("v5p-16")  # 8 chips, 2 hosts
    c.mesh.shape = (1, -1, 8)
    assert not _valid(c, v5p)
    c.mesh.shape = (1, -1, 4)  # fsdp 2: one block of rows per host
    assert _valid(c, v5p)
    c = tiny_config(num_prompts=3)
    with pytest.raises(ConfigError, match=r"num_prompts=3 does not split over 2 processes"):
        plan_lib.make_plan(c, gpus)


def test_target_table():
    t = targets_lib.parse_target("16xh100")
    assert (t.num_devices, t.num_hosts, t.platform) == (16, 2, "cuda")
    assert targets_lib.parse_target("v5p-16").num_devices == 8  # 16 TensorCores = 8 chips
    assert targets_lib.parse_target("v5e-16").num_devices == 16
    assert targets_lib.parse_target("tpu:v5p:2x2x1,slices=2").num_devices == 8
    assert targets_lib.parse_target("cuda:1x2x4:a100-80g").num_devices == 8
    for chip in ("h100", "h200", "a100-80g"):  # the shipped GPU descriptions
        text = targets_lib.gpu_target_config(targets_lib.CHIPS[chip])
        assert "collective_memory_granularity" not in text
        assert f"device_memory_size: {targets_lib.CHIPS[chip].memory_bytes}" in text


def test_gpu_usable_memory_is_the_runs_pool_at_most_the_card_less_the_reserve():
    """Runs set XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 (docs/scale.md): on an H200
    the 4 GiB reserve left 3 GiB more than that pool (137.0 GiB against 133.95).
    Hand-worked from the proto's device_memory_size."""
    h200, h100 = (targets_lib.parse_target(n) for n in ("1xh200", "8xh100"))
    assert h200.usable_bytes == 143827717324  # floor(0.95 x 151397597184)
    assert h100.usable_bytes == 84942979072 - 4 * 2**30  # the reserve binds on 80 GB


@needs_tpu
def test_tpu_usable_hbm_is_libtpus_available_hbm():
    """The TPU fits check used the nominal HBM; libtpu's compiler refuses a program
    over its own, lower figure on v4 / v5e / v6e (higher on a v5p). Each chip: one
    over-size array compiled, the available HBM read from the compiler's error."""
    import re

    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    for name in ("v4-8", "v5e-4", "v5p-8", "v6e-8"):
        target = targets_lib.parse_target(name)
        sh = NamedSharding(Mesh(targets_lib.target_devices(target)[:1], ("x",)), P())
        n = (target.chip.memory_bytes + 2 * 2**30) // 4  # f32: 2 GiB over the nominal size
        f = jax.jit(lambda x, n=n: jnp.arange(n, dtype=jnp.float32) * x, out_shardings=sh)
        with pytest.raises(Exception, match="RESOURCE_EXHAUSTED") as e:
            f.lower(jax.ShapeDtypeStruct((), jnp.float32, sharding=sh)).compile()
        got = re.search(r"available HBM \(([\d.]+)G\)", str(e.value))
        assert got, str(e.value)[:300]
        assert target.usable_bytes / 2**30 == pytest.approx(float(got.group(1)), abs=0.005), name


@needs_tpu
def test_multislice_mesh_puts_the_slices_on_the_outer_batch_axis():
    """`tpu:<topology>,slices=N` (a RAW_FORMS example) gave devices of N slice_index
    values, and jax.make_mesh raised: the mesh is now hybrid, the slices (DCN) split
    "data" when it divides by their count, else "fsdp"; never "tensor"."""
    from gdpo_jax.sharding import make_mesh

    devices = targets_lib.target_devices(targets_lib.parse_target("tpu:v5e:2x2,slices=2"))
    assert len(devices) == 8
    mesh = make_mesh((-1, 1, 1), devices=devices)
    assert [d.slice_index for d in mesh.devices[:, 0, 0]] == [0] * 4 + [1] * 4
    mesh = make_mesh((1, -1, 2), devices=devices)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
    assert [{d.slice_index for d in row} for row in mesh.devices[0]] == [{0}] * 2 + [{1}] * 2
    with pytest.raises(ValueError, match="slices"):
        make_mesh((1, 1, -1), devices=devices)


@needs_tpu
def test_every_tpu_target_gets_its_device_count_from_libtpu():
    """Each TPU target's abstract devices are its chips (v4-16: 8 chips of 2
    TensorCores, each chip one device as JAX runs a v4; libtpu's default
    describes every core, and the v4 targets failed to plan)."""
    for name, target in targets_lib.TARGETS.items():
        if target.platform == "tpu":
            assert len(targets_lib.target_devices(target)) == target.num_devices, name


def test_missing_extra_is_one_line_naming_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda n, *a: None if n in ("libtpu", "jax_plugins.xla_cuda12") else real(n, *a),
    )
    for name in ("v5p-8", "8xh100"):
        with pytest.raises(targets_lib.MissingExtraError) as e:
            targets_lib.target_devices(targets_lib.parse_target(name))
        assert ".[aot]" in str(e.value) and "\n" not in str(e.value)


def test_batch_not_dividing_the_mesh_names_the_field():
    from gdpo_jax.scale.plan import make_plan

    # 32 rows / 4 micro-batches = 8 rows, not divisible over v5p-32's 16 chips.
    cfg = tiny_config(num_microbatches=4)
    with pytest.raises(ConfigError, match="num_microbatches"):
        make_plan(cfg, targets_lib.parse_target("v5p-32"))


def test_model_from_variant_name_without_checkpoint():
    from gdpo_jax.scale.plan import PlanError, model_config

    c = base_config()
    c.model.name = "r1-distill-7b"
    assert model_config(c).num_params() == pytest.approx(7.6e9, rel=0.01)
    c.model.name = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"  # the configs' hub id
    assert model_config(c).num_layers == 28
    c.model.name = "/no/such/checkpoint"
    with pytest.raises(PlanError, match="config.model.name"):
        model_config(c)


def _hand_model() -> ModelConfig:
    """The model of the hand-worked FLOP counts (D, F, L, HQ, HKV, DH, V above)."""
    return ModelConfig.tiny(
        hidden_size=D,
        intermediate_size=F,
        num_layers=L,
        num_heads=HQ,
        num_kv_heads=HKV,
        head_dim=DH,
        vocab_size=V,
    )


def test_flops_against_a_token_by_token_count():
    mc = _hand_model()
    P_, C_, U, G = 5, 3, 2, 4
    s = flops_lib.StepShape(
        rows=U * G,
        prompts=U,
        rows_per_call=U * G,
        prompt_len=P_,
        new_tokens=C_,
        logprob_passes=2,
        epochs=1,
        remat=True,
        micro_batches=1,
        param_bytes=0,
        kv_bytes_per_token=0,
    )
    q, kv = HQ * DH, HKV * DH
    per_tok = 2 * L * (D * q + 2 * D * kv + q * D + 3 * D * F)  # the matmuls, one token
    attn = lambda ctx: 4 * L * q * ctx  # noqa: E731 - QK^T and AV over ctx positions
    prefill = U * (sum(per_tok + attn(t) for t in range(1, P_ + 1)) + 2 * D * V)
    decode = U * G * sum(per_tok + 2 * D * V + attn(P_ + t) for t in range(1, C_ + 1))
    layers = U * G * sum(per_tok + attn(t) for t in range(1, P_ + C_ + 1))
    fwd = layers + U * G * C_ * 2 * D * V
    got = flops_lib.step_flops(mc, s)
    # remat re-runs the layers' forward in the backward, not the unembedding (it
    # counted (3 + remat) whole passes: 4 fwd), nor the down projection, whose output
    # no backward rule reads (tests/test_remat_policy.py finds it missing from XLA's
    # count; it was counted): 2 d f per token and layer.
    down = lambda tokens: tokens * 2 * L * D * F  # noqa: E731
    rerun = layers - down(U * G * (P_ + C_))
    np.testing.assert_allclose(
        [got["prefill"], got["decode"], got["logprob"], got["train"]],
        [prefill, decode, 2 * fwd, 3 * fwd + rerun],
        rtol=1e-12,
    )
    # Prompt sharing: each prompt's P tokens once (U of them), then every row's C
    # tokens, which attend to the prompt and their own earlier tokens.
    shared = dataclasses.replace(s, train_prompt_share=G)
    own = U * G * sum(per_tok + 2 * D * V + attn(P_ + t) for t in range(1, C_ + 1))
    prompt_once = U * sum(per_tok + attn(t) for t in range(1, P_ + 1))
    got = flops_lib.step_flops(mc, shared)
    own_layers = own - U * G * C_ * 2 * D * V
    shared_rerun = prompt_once + own_layers - down(U * P_ + U * G * C_)
    np.testing.assert_allclose(
        [got["logprob"], got["train"]],
        [2 * (prompt_once + own), 3 * (prompt_once + own) + shared_rerun],
    )
    assert got["train"] < 3 * fwd + layers
    # Decode in phases (2, 1): steps 1-2 attend over the first phase's P + 2 slots,
    # step 3 over P + 3, the slots no token has reached yet included.
    phased = dataclasses.replace(s, decode_chunks=(2, 1))
    ctx = (P_ + 2, P_ + 2, P_ + 3)
    want = U * G * sum(per_tok + 2 * D * V + attn(c) for c in ctx)
    assert flops_lib.step_flops(mc, phased)["decode"] == pytest.approx(want, rel=1e-12)
    assert want > decode  # more than the filled slots' count
    # remat_policy="dots" keeps the weight products: the backward re-runs only the
    # attention dots, per row and position the attn() terms of `layers`; the roofline's
    # training passes read the weights 3 times, not 4.
    dots = dataclasses.replace(s, remat_policy="dots")
    attention = U * G * sum(attn(t) for t in range(1, P_ + C_ + 1))
    got = flops_lib.step_flops(mc, dots)
    assert got["train"] == pytest.approx(3 * fwd + attention, rel=1e-12)
    chip = dict(num_devices=1, peak_flops=1e30, hbm_bw=1.0)  # memory bound: weight reads
    big = dict(param_bytes=1000)
    t_full = flops_lib.roofline(mc, dataclasses.replace(s, **big), **chip)["train"]
    t_dots = flops_lib.roofline(mc, dataclasses.replace(dots, **big), **chip)["train"]
    assert (t_full, t_dots) == (4000.0, 3000.0)


def test_flops_count_the_chunked_unembeddings_recompute_and_padding():
    """algo.logprob_chunk_size = c re-runs each chunk's unembedding in the backward
    (jax.checkpoint of its body), with or without model.remat, over ceil(C / c) c
    positions (the last chunk padded): hand-worked with C = 3, c = 2, so 4 positions
    a row."""
    mc = _hand_model()
    P_, C_, N = 5, 3, 8
    s = flops_lib.StepShape(
        rows=N,
        prompts=2,
        rows_per_call=N,
        prompt_len=P_,
        new_tokens=C_,
        logprob_passes=1,
        epochs=2,
        remat=False,
        micro_batches=2,
        param_bytes=0,
        kv_bytes_per_token=0,
        logprob_chunk_size=2,
    )
    q, kv = HQ * DH, HKV * DH
    per_tok = 2 * L * (D * q + 2 * D * kv + q * D + 3 * D * F)
    layers = N * sum(per_tok + 4 * L * q * t for t in range(1, P_ + C_ + 1))
    unembed = N * 4 * 2 * D * V  # 2 chunks of 2 positions per row
    got = flops_lib.step_flops(mc, s)
    assert got["logprob"] == pytest.approx(layers + unembed, rel=1e-12)
    assert got["train"] == pytest.approx(2 * (3 * (layers + unembed) + unembed), rel=1e-12)
    remat = flops_lib.step_flops(mc, dataclasses.replace(s, remat=True))
    rerun = layers - N * (P_ + C_) * 2 * L * D * F  # not the down projection
    assert remat["train"] == pytest.approx(2 * (3 * layers + rerun + 4 * unembed), rel=1e-12)
    whole = flops_lib.step_flops(mc, dataclasses.replace(s, logprob_chunk_size=0))
    assert whole["train"] == pytest.approx(2 * 3 * (layers + N * 3 * 2 * D * V), rel=1e-12)


def test_sampler_calls_are_the_configured_rows_per_call_each_padded_to_the_shards():
    """8 rows in calls of 2 over 4 batch shards: 4 calls, each decoding 4 rows (the
    sampler pads a call's rows to the shards). The planner recorded the padded 4 as
    the rows per call: 2 calls, half the decode. Hand-worked roofline, 4 devices:
    4 calls x 10 steps x (1000 B of weights + 1 row x 10 B x (100 + 10 / 2) slots)
    at 1000 B/s = 82 s; prefill 4 calls x 1000 B = 4 s."""
    mc = ModelConfig.tiny()
    s = flops_lib.StepShape(**{**ROOFLINE_SHAPE, "rows_per_call": 2, "batch_shards": 4})
    assert (s.calls, s.call_rows) == (4, 4)
    got = flops_lib.roofline(mc, s, **{**ROOFLINE_CHIP, "num_devices": 4})
    assert got["decode"] == pytest.approx(82.0) and got["prefill"] == pytest.approx(4.0)
    fl = flops_lib.step_flops(mc, s)
    unpadded = flops_lib.step_flops(mc, dataclasses.replace(s, batch_shards=1))
    assert fl["decode"] == pytest.approx(2 * unpadded["decode"])  # 16 rows decoded, not 8
    assert fl["prefill"] == unpadded["prefill"]  # the padding rows copy a prompt: no prefill


def test_roofline_reads_one_devices_tensor_shard_of_the_weights():
    """A "tensor" axis of 2 splits every weight (and the 2 kv heads of the tiny model)
    over 2 devices, which FSDP's gathers leave split: each device reads half the
    weights per decode step and per training pass. Hand-worked, 2 devices, 1 batch
    shard: decode 10 steps x (500 B + 8 rows x 10 B / 2 x 105 slots) / 1000 B/s = 47 s;
    prefill 500 B = 0.5 s; 2 log-prob passes x 1 micro-batch x 500 B = 1 s; train
    3 passes x 500 B = 1.5 s. Continuous batching gathers the weights (every kv head)
    whole: decode 10 x (1000 + 8 x 10 x 105) / 1000 = 94 s."""
    mc = ModelConfig.tiny()
    s = flops_lib.StepShape(**{**ROOFLINE_SHAPE, "logprob_passes": 2, "tensor": 2})
    got = flops_lib.roofline(mc, s, **{**ROOFLINE_CHIP, "num_devices": 2})
    want = dict(decode=47.0, prefill=0.5, logprob=1.0, train=1.5)
    assert {k: got[k] for k in want} == pytest.approx(want)
    whole = dataclasses.replace(s, sampler_weights_whole=True)
    got = flops_lib.roofline(mc, whole, **{**ROOFLINE_CHIP, "num_devices": 2})
    assert got["decode"] == pytest.approx(94.0) and got["train"] == pytest.approx(1.5)


# A step shape for the roofline's memory-bound decode: 8 rows of 2 prompts, 100-token
# prompts, 10 new tokens, 1000 B of weights, no training passes.
ROOFLINE_SHAPE = dict(
    rows=8,
    prompts=2,
    rows_per_call=8,
    prompt_len=100,
    new_tokens=10,
    logprob_passes=0,
    epochs=1,
    remat=False,
    micro_batches=1,
    param_bytes=1000,
    kv_bytes_per_token=10,
)
ROOFLINE_CHIP = dict(num_devices=1, peak_flops=1e30, hbm_bw=1000.0)


def test_continuous_batching_with_fewer_lanes_than_rows_decodes_in_rounds():
    """2 lanes for a shard's 8 rows: 4 rounds of 10 steps, each reading the weights, and
    the rounds after the first all 100 + 10 slots (the last phase runs until the work is
    done). The planner counted one round of 8 rows, as the static decode: the estimate
    was the same for any lane count. Hand-worked: 10 x (1000 + 2 x 10 x (100 + 5)) +
    3 x 10 x (1000 + 2 x 10 x 110) = 127000 B at 1000 B/s; 8 lanes: one round, the
    static 10 x (1000 + 8 x 10 x 105) = 94000 B."""
    mc = ModelConfig.tiny()
    static = flops_lib.StepShape(**ROOFLINE_SHAPE)
    two, eight = (dataclasses.replace(static, decode_lanes=n) for n in (2, 8))
    assert (two.decode_rounds, eight.decode_rounds, static.decode_rounds) == (4, 1, 1)
    roof = {
        k: flops_lib.roofline(mc, v, **ROOFLINE_CHIP)
        for k, v in [("s", static), ("2", two), ("8", eight)]
    }
    assert roof["2"]["decode"] == pytest.approx(127.0)
    assert roof["8"]["decode"] == roof["s"]["decode"] == pytest.approx(94.0)
    # FLOPs: the same 80 row-steps of matmuls; attention over 2 x (10 x 100 + 55 + 3 x 10 x
    # 110) slot-steps instead of 8 x (10 x 100 + 55): 270 more, at 4 L Hq Dh each.
    fl = {
        k: flops_lib.step_flops(mc, v)["decode"]
        for k, v in [("s", static), ("2", two), ("8", eight)]
    }
    assert fl["8"] == fl["s"]
    assert fl["2"] - fl["s"] == pytest.approx(270 * 4 * mc.num_layers * mc.num_heads * mc.head_dim)


def test_roofline_decode_reads_a_shared_prompt_once_per_group():
    """Decode's memory time: every step reads the weights and each row's
    cache, a shared prompt's slots once per prompt_share rows (hand-worked:
    10 steps x (1000 B + 8 rows x 10 B x (100 / share + 10 / 2)) / 1000 B/s)."""
    mc = ModelConfig.tiny()
    for share, want in ((1, 94.0), (4, 34.0)):
        s = flops_lib.StepShape(**ROOFLINE_SHAPE, prompt_share=share)
        got = flops_lib.roofline(mc, s, **ROOFLINE_CHIP)
        assert got["decode"] == pytest.approx(want) and got["bound"]["decode"] == "memory"


def test_roofline_logprob_reads_weights_once_per_micro_batch_of_a_pass():
    """A log-prob pass runs U x M micro-batches, once per step whatever the epochs;
    the training passes run them once per epoch. Hand-worked: 2 passes x 4 micro-batches
    x 1000 B at 1000 B/s = 8 s for the log-probs; the training, 3 passes x 2 epochs x 4,
    24 s (micro_batches counts epochs x U x M = 8). It read 16 s for the log-probs."""
    mc = ModelConfig.tiny()
    shape = dict(ROOFLINE_SHAPE, logprob_passes=2, epochs=2, micro_batches=8)
    got = flops_lib.roofline(mc, flops_lib.StepShape(**shape), **ROOFLINE_CHIP)
    assert got["logprob"] == pytest.approx(8.0) and got["bound"]["logprob"] == "memory"
    assert got["train"] == pytest.approx(24.0)


def test_roofline_decode_reads_each_phases_whole_cache():
    """The static decode's phase j holds P + E_j slots and its steps read them all
    (the planner counted only the filled ones, C / 2 per step, so one phase cost
    what 4 did). Hand-worked, 10 new tokens: 2 phases (5, 5) read own slots
    5 x 5 + 5 x 10 = 75 over the 10 steps, one phase 10 x 10 = 100; decode
    10 x 1000 B of weights + 8 rows x 10 B x (100 x 10 + own slots), at 1000 B/s."""
    from gdpo_jax.scale.flops import own_slots_per_step

    assert own_slots_per_step(10, (5, 5)) == pytest.approx(7.5)
    assert own_slots_per_step(10, (10,)) == pytest.approx(10.0)
    assert own_slots_per_step(8, (2, 2, 2, 2)) == pytest.approx(8 * 5 / 8)  # 4 phases: 5/8 C
    mc = ModelConfig.tiny()
    for chunks, own in (((5, 5), 75), ((10,), 100), ((), 50)):
        s = flops_lib.StepShape(**ROOFLINE_SHAPE, decode_chunks=chunks)
        got = flops_lib.roofline(mc, s, **ROOFLINE_CHIP)
        assert got["decode"] == pytest.approx((10 * 1000 + 8 * 10 * (100 * 10 + own)) / 1000)


def test_roofline_decode_reads_the_unrolled_forms_weight_copy():
    """The unrolled decode forms read a compute-dtype copy of the weights, made
    once per call (sampling.decode.weights_in): hand-worked, 2 calls of 4 rows,
    10 steps, 1000 B stored, 500 B copied, no KV cache:
    decode 2 x ((1000 + 500) + 10 x 500) / 1000 B/s = 13 s; prefill 2 x 500 / 1000."""
    mc = ModelConfig.tiny()
    s = flops_lib.StepShape(**{**ROOFLINE_SHAPE, "rows_per_call": 4, "kv_bytes_per_token": 0})
    scan = flops_lib.roofline(mc, s, **ROOFLINE_CHIP)
    copy = flops_lib.roofline(mc, dataclasses.replace(s, decode_param_bytes=500), **ROOFLINE_CHIP)
    assert scan["decode"] == pytest.approx(2 * 10 * 1000 / 1000.0)
    assert copy["decode"] == pytest.approx(13.0) and copy["prefill"] == pytest.approx(1.0)
    # The other phases read the stored weights.
    assert copy["train"] == scan["train"] and copy["logprob"] == scan["logprob"]


def test_roofline_kv_reads_split_over_tensor_only_where_the_heads_divide():
    """The KV cache's heads split over "tensor" only where they divide (the cache's
    sanitize_spec rule), else every device reads every head. Hand-worked decode,
    1 device's share, 10 steps x (1000 B / tensor of weights + 8 rows x 10 B x
    105 slots / kv shards) at 1000 B/s: 2 kv heads on tensor 4 stay whole,
    10 x (250 + 8400) / 1000 = 86.5 s; 3 heads on tensor 2 too, 10 x (500 + 8400)
    / 1000 = 89 s; 3 heads on tensor 3 split, 10 x (1000 / 3 + 2800) / 1000."""
    from gdpo_jax.scale.flops import kv_head_shards

    cases = ((2, 4), (2, 2), (3, 2), (3, 3), (8, 4))  # (kv heads, tensor)
    assert [kv_head_shards(h, t) for h, t in cases] == [1, 2, 1, 3, 4]
    kv3 = ModelConfig.tiny(num_heads=6, num_kv_heads=3)
    for mc, tensor, want in (
        (_hand_model(), 4, 86.5),
        (_hand_model(), 2, 47.0),
        (kv3, 2, 89.0),
        (kv3, 3, 10 * (1000 / 3 + 2800) / 1000),
    ):
        s = flops_lib.StepShape(**ROOFLINE_SHAPE, tensor=tensor)
        got = flops_lib.roofline(mc, s, **{**ROOFLINE_CHIP, "num_devices": tensor})
        assert got["decode"] == pytest.approx(want), (mc.num_kv_heads, tensor)


def test_static_sampler_cache_splits_kv_heads_only_where_they_divide():
    """The static sampler's KV cache per device: rows / batch shards x 2 (k, v) x L x
    Dh x 4 B (f32) x kv heads per device x (P + M) slots. Hand-worked, 8 rows,
    1 batch shard, L 2, Dh 16, P = M = 16: 8 x 256 B x heads x 32; the 2 kv heads
    split on tensor 2 (1 a device), stay whole on tensor 4."""
    from jax.sharding import AbstractMesh

    from gdpo_jax.scale.plan import _sampler_memory

    cfg, mc = tiny_config(), _hand_model()
    for tensor, heads in ((1, 2), (2, 1), (4, 2)):
        mesh = AbstractMesh((1, 1, tensor), ("data", "fsdp", "tensor"))
        got = _sampler_memory(cfg, mc, mesh, 8, 1, 0, 0)
        assert got == dict(kv_cache_bytes=8 * 256 * heads * 32, decode="static"), tensor


def test_tpu_targets_count_their_hosts():
    """TPU VMs per slice (Cloud TPU system-architecture pages): 4 chips per v4 / v5p
    VM (v5p 2x2x2 = 2 hosts, 2x4x4 = 8, 4x4x4 = 16); a v5e / v6e slice of up to
    8 chips is one VM, larger ones 4-chip VMs (4x4 = 4 VMs, 4x8 = 8); each slice
    of a multi-slice target its own. Every TPU target had 1."""
    want = {
        "v4-8": 1,  # 4 chips
        "v4-16": 2,  # 8
        "v5p-8": 1,
        "v5p-16": 2,
        "v5p-32": 4,  # 16 chips
        "v5p-64": 8,
        "v5p-128": 16,
        "v5e-4": 1,
        "v5e-8": 1,  # one 8-chip VM
        "v5e-16": 4,
        "v5e-32": 8,
        "v6e-8": 1,
        "v6e-16": 4,
        "tpu:v5p:2x2x2": 2,
        "tpu:v5p:2x2x2,slices=2": 4,
        "tpu:v5e:2x2,slices=2": 2,
        "tpu:v6e:4x4,slices=3": 12,
        "16xh100": 2,
        "cuda:2x2x8:h100": 4,
    }
    assert {n: targets_lib.parse_target(n).num_hosts for n in want} == want


def _plan_for_report(**programs) -> dict:
    """A plan dict as make_plan returns it, with the given programs' byte figures."""
    return dict(
        target="v5p-16",
        device="8 x TPU v5p (v5p:2x2x2)",
        num_hosts=2,
        mesh={"data": 1, "fsdp": 8, "tensor": 1},
        num_params=1.5e9,
        usable_gib=95.74,
        device_memory_gib=95.0,
        programs=programs,
        per_device=dict(params=0),
        fits=True,
        peak_gib=0.0,
        peak_program="step",
        step_flops=1e18,
        est_step_s=1.0,
        roofline=dict(
            prefill=0.0,
            decode=0.0,
            logprob=0.0,
            train=1.0,
            bound=dict(prefill="compute", decode="memory", logprob="compute", train="compute"),
        ),
    )


def _printed_memory_rows(text: str) -> dict[str, dict[str, float]]:
    """format_plan's memory table: {program: {column: GiB}} from its header and rows."""
    lines = text.splitlines()
    i = next(k for k, x in enumerate(lines) if x.startswith("program"))
    cols = lines[i].split("fits")[0].split()[1:]
    rows = {}
    for line in lines[i + 1 :]:
        parts = line.split()
        if len(parts) < len(cols) + 2 or parts[-1] not in ("yes", "NO"):
            break
        rows[parts[0]] = dict(zip(cols, map(float, parts[1 : 1 + len(cols)])))
    return rows


def test_format_plan_memory_columns_add_up_to_the_total():
    """The printed args + out - alias + temp + beside left the generated code out:
    a v5p plan's step printed 26.55 of its 26.60 GiB. Hand-made plan: 5.25 + 5.5 -
    5.5 + 19.25 + 0.07 (code) + 1.75 = 26.32 GiB; and every committed plan's rows add
    up within the rounding of their 7 printed figures (0.005 each)."""
    import json

    from gdpo_jax.scale.report import format_plan

    gib = 2**30
    step = dict(
        args=int(5.25 * gib),
        outputs=int(5.5 * gib),
        aliased=int(5.5 * gib),
        temps=int(19.25 * gib),
        code=int(0.07 * gib),
        resident_bytes=int(1.75 * gib),
        fits=True,
        compiled=True,
    )
    step["total_bytes"] = int(26.32 * gib)
    generate = dict(
        step,
        args=int(1.0 * gib),
        outputs=0,
        aliased=0,
        temps=int(18.5 * gib),
        code=int(0.03 * gib),
        resident_bytes=int(5.25 * gib),
        total_bytes=int(24.78 * gib),  # 1 + 18.5 + 0.03 + 5.25
        decode="static",
        rows_per_call=64,
        decode_layers="scan",
        decode_phases=1,
    )
    text = format_plan(_plan_for_report(step=step, generate=generate))
    assert text.splitlines()[0].startswith("target v5p-16: 8 x TPU v5p (v5p:2x2x2) on 2 hosts,")
    rows = _printed_memory_rows(text)
    assert (rows["step"]["code"], rows["generate"]["code"]) == (0.07, 0.03)
    assert (rows["step"]["total"], rows["generate"]["total"]) == (26.32, 24.78)
    for row in rows.values():
        parts = row["args"] + row["out"] - row["alias"] + row["temp"] + row["code"] + row["beside"]
        assert parts == pytest.approx(row["total"], abs=1e-9)

    plans = json.loads(open(os.path.join(ROOT, "docs", "scale", "plans.json")).read())
    checked = 0
    for key, plan in plans.items():
        for name, row in _printed_memory_rows(format_plan(plan)).items():
            parts = (
                row["args"] + row["out"] - row["alias"] + row["temp"] + row["code"] + row["beside"]
            )
            assert abs(parts - row["total"]) <= 7 * 0.005 + 1e-9, (key, name, row)
            checked += 1
    assert checked >= 30, checked


def test_format_plan_without_a_generate_program_prints_no_sampler_line():
    """A plan dict of the training programs alone was a KeyError ('decode_growth'):
    the sampler line read the `generate` program's fields from an empty dict."""
    from gdpo_jax.scale.report import format_plan

    step = dict(
        args=2**30, outputs=0, aliased=0, temps=2**30, code=0, resident_bytes=0,
        total_bytes=2 * 2**30, fits=True, compiled=True,
    )  # fmt: skip
    text = format_plan(_plan_for_report(step=step))
    assert set(_printed_memory_rows(text)) == {"step"}
    assert not any(x.startswith("sampler:") for x in text.splitlines())


# --------------------------------------------------------------- compile: TPU
@needs_tpu
def test_tiny_plan_on_tpu_bytes_per_device():
    from gdpo_jax.scale.plan import make_plan

    plan = make_plan(tiny_config(), targets_lib.parse_target("tpu:v5e:2x2"))
    assert plan["fits"] and plan["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    assert plan["attention"] == "splash"  # "auto" on a TPU target: the Pallas kernel
    # One update per batch: the step's own forward gives the old log-probs, so
    # the separate log-prob program never runs and is not planned.
    assert set(plan["programs"]) == {"step", "generate"}
    # Independent arithmetic: f32 weights, matrices split 4 ways over fsdp, norms whole.
    params = (n_matrix() // 4 + n_vector()) * 4
    assert plan["per_device"]["params"] == params
    # AdamW: mu and nu like the params, plus a few scalar counters.
    assert 2 * params <= plan["per_device"]["optimizer"] <= 2 * params + 64
    step = plan["programs"]["step"]
    assert step["args"] >= params * 3  # state (params + 2 moments) + batch
    for p in plan["programs"].values():
        assert p["total_gib"] > 0 and p["temp_gib"] >= 0 and p["args_gib"] > 0
    assert plan["peak_program"] in plan["programs"]
    assert plan["step_flops"] > 0 and plan["est_step_s"] > 0
    assert plan["device_memory_gib"] == 16


@needs_tpu
def test_multislice_plan_counts_every_padded_sampler_call_and_the_batch_shards():
    """A plan of two v5e slices (it raised in jax.make_mesh), mesh data 2 (over the
    slices) x fsdp 4, 8 prompts x G 2 = 16 rows in calls of 4 (2 prompts, one per host:
    the run refuses calls that do not split over its processes): each call's 4 rows are
    padded to the 8 batch shards, so 4 calls decode 8 rows each (the plan recorded the
    unpadded rows per call: half the decode). Its roofline is the search's estimate of
    the same config."""
    from gdpo_jax.scale.plan import make_plan
    from gdpo_jax.scale.search import estimate

    cfg = tiny_config(group_size=2)
    cfg.mesh.shape = (2, 4, 1)
    cfg.sampling.rows_per_call = 4
    target = targets_lib.parse_target("tpu:v5e:2x2,slices=2")
    plan = make_plan(cfg, target)
    assert plan["fits"] and plan["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
    assert plan["device"] == "8 x TPU v5e (v5e:2x2 x 2 slices)"
    assert plan["num_hosts"] == 2  # one 4-chip VM per slice
    assert plan["usable_gib"] == pytest.approx(15.75)
    shape = plan["step_shape"]
    assert (shape["rows_per_call"], plan["programs"]["generate"]["rows_per_call"]) == (4, 8)
    assert (shape["batch_shards"], shape["tensor"]) == (8, 1)
    # Hand count: 4 calls x 8 rows x 16 steps, each step over all P + C = 32 slots
    # (16 new tokens: one decode phase).
    q, kv = HQ * DH, HKV * DH
    per_tok = 2 * L * (D * q + 2 * D * kv + q * D + 3 * D * F)
    step = per_tok + 2 * D * V + 4 * L * q * 32
    assert plan["flops"]["decode"] == pytest.approx(4 * 8 * 16 * step, rel=1e-12)
    assert estimate(cfg, plan, target) == pytest.approx(plan["est_step_s"], rel=1e-12)
    from gdpo_jax.scale.report import format_plan

    text = format_plan(plan)
    assert "4 rows per call (each call decodes 8: padded to the batch shards)" in text
    assert "(v5e:2x2 x 2 slices) on 2 hosts, mesh" in text


@pytest.mark.slow  # four TPU compiles (two stop early, out of memory)
@needs_tpu
def test_oversized_sampler_does_not_fit_and_the_suggestion_does():
    from gdpo_jax.scale.plan import make_plan
    from gdpo_jax.scale.search import _apply, find_fit

    # 4096 rows x (64 + 32) tokens of f32 KV (128 layers x 4 kv heads x 64 dims x k, v):
    # 256 KiB per token and row, 1024 rows per chip -> 24 GiB of cache on a 16 GiB v5e
    # chip. The cache is deep (many layers, scanned: one layer body to compile) rather
    # than wide: libtpu's compile of the step grows with its rows far more than with
    # its layers (a step of 131072 rows x 4 layers compiled in about 40 s, this one of
    # 4096 rows x 128 layers in 10-20 s).
    # 32 new tokens = one decode phase (one loop body to compile). Each
    # row holds a copy of its prompt's slots (a shared prompt cache would
    # make it 8 + 32 tokens per row, and fit).
    cfg = tiny_config(num_prompts=512, group_size=8, num_microbatches=256, old_logprobs="sampler")
    cfg.model.tiny.update(dict(num_layers=128, num_kv_heads=4, head_dim=64))
    cfg.sampling.max_prompt_len, cfg.sampling.max_new_tokens = 64, 32
    cfg.sampling.share_prompt_cache = False
    target = targets_lib.parse_target("tpu:v5e:2x2")
    plan = make_plan(cfg, target)
    assert not plan["fits"] and not plan["programs"]["generate"]["fits"]
    assert plan["programs"]["step"]["fits"]
    fix = find_fit(cfg, target, plan, max_tries=4)
    assert fix is not None and fix["overrides"][0].startswith("--config.sampling.rows_per_call=")
    confirmed = make_plan(_apply(cfg, fix["changes"]), target)
    # find_fit planned this very config and found it fits (its compiles are cached in
    # gdpo_jax.scale.plan). If not, say why per program: that is how a stub of make_plan
    # leaked from another test into find_fit showed (tests/test_plan_table_sweep.py).
    why = {
        k: {f: p.get(f) for f in ("fits", "compiled", "error", "total_bytes", "compile_s")}
        for k, p in confirmed["programs"].items()
    }
    assert confirmed["fits"], (fix, confirmed["usable_gib"], why)


# --------------------------------------------------------------- compile: GPU
@needs_cuda
def test_tiny_plan_on_gpu():
    from gdpo_jax.scale.plan import make_plan

    target = targets_lib.parse_target("cuda:1x1x2:h100")
    # Two updates per batch: the old and the reference log-probs are separate passes.
    plan = make_plan(tiny_config(beta=0.01, num_minibatches=2), target)
    assert plan["fits"] and plan["num_devices"] == 2
    params = (n_matrix() // 2 + n_vector()) * 4
    assert plan["per_device"]["params"] == plan["per_device"]["ref_params"] == params
    assert plan["programs"]["logprob"]["runs_per_step"] == 2  # old + reference
    assert plan["programs"]["step"]["resident_bytes"] == params  # the reference beside it
    # Beside the log-prob program: optimizer, reference and the batch arrays it does not
    # read (old_logp, ref_logp: f32 [32, 16]; rewards f32 [32, 2]; group_ids i32 and
    # valid bool [32]), over 2 devices; its ids and masks are its arguments (they were
    # counted twice).
    others = (2 * 32 * 16 * 4 + 32 * 2 * 4 + 32 * 4 + 32) // 2
    lp = plan["programs"]["logprob"]
    assert lp["resident_bytes"] == plan["per_device"]["optimizer"] + params + others
    # One update: the step runs both forwards itself, the reference weights its argument.
    one = make_plan(tiny_config(beta=0.01), target)
    assert set(one["programs"]) == {"step", "generate"}
    assert one["programs"]["step"]["resident_bytes"] == 0
    # It reads the reference params and no longer the f32 [N, C] old_logp and ref_logp
    # keys (N = 8 x 4 rows, C = 16, over 2 devices).
    keys = 2 * 8 * 4 * 16 * 4 // 2
    assert one["programs"]["step"]["args"] == plan["programs"]["step"]["args"] + params - keys
    # FLOPs: the reference forward is still paid (in the step); the old one is not.
    assert one["step_shape"]["logprob_passes"] == 1 and one["flops"]["logprob"] > 0
    assert one["programs"]["step"]["logprob_passes"] == 1  # check_plan's step roofline adds it
    assert plan["programs"]["step"]["logprob_passes"] == 0
    assert plan["usable_gib"] == pytest.approx(84942979072 / 2**30 - 4)


@needs_cuda
def test_continuous_batching_plan_compiles_its_decode_and_counts_the_gathered_weights():
    """With sampling.continuous_slots set the planner compiled the static decode,
    so the weights each batch shard gathers for its lanes were not counted."""
    from gdpo_jax.scale.arch import model_config
    from gdpo_jax.scale.plan import format_plan, make_plan

    vocab = 65536  # embeddings large enough that the gathered weights dominate the decode
    target = targets_lib.parse_target("cuda:1x1x4:h100")  # fsdp=4: every matrix split 4 ways
    plans = {}
    for slots in (0, 4):
        c = tiny_config()
        c.model.tiny.vocab_size = vocab
        c.sampling.continuous_slots = slots
        plans[slots] = make_plan(c, target)
    static, cont = plans[0]["programs"]["generate"], plans[4]["programs"]["generate"]
    assert static["decode"] == "static" and cont["decode"] == "continuous"
    # 32 rows over 4 batch shards: 8 rows and min(4, 8) = 4 lanes per shard.
    assert cont["slots"] == 4 and cont["lanes_per_shard"] == 4
    # Hand arithmetic: f32 matrices, each device holds a quarter and gathers the rest.
    matrices = L * (D * (HQ * DH + 2 * HKV * DH) + HQ * DH * D + 3 * D * F) + 2 * vocab * D
    assert cont["gathered_params_bytes"] == matrices * 4 * 3 // 4
    # The compiler's temporaries hold them: above the static decode's by most of them.
    assert cont["temps"] - static["temps"] >= cont["gathered_params_bytes"] // 2
    # KV cache per device: 4 lanes of P + M = 32 slots (each a prompt copy) and the
    # prefilled window of ceil(8 / G) + 1 = 3 prompts of P = 16 slots, every kv head.
    itemsize = np.dtype(model_config(c).dtype).itemsize
    per_token = 2 * L * HKV * DH * itemsize
    assert plans[4]["per_device"]["kv_cache"] == per_token * (4 * 32 + 3 * 16)
    assert "continuous batching, 4 lanes per batch shard" in format_plan(plans[4])


@needs_cuda
def test_continuous_batching_plans_on_one_device_with_explicit_axes():
    """On one device the Sampler calls continuous batching unmeshed, with plain
    device arrays; the planner lowered it under the (Explicit) mesh with
    batch-typed rows, and tracing failed in the refill's gather ("Use
    `.at[...].get(out_sharding=)`"): `make plan` crashed for e.g. 1xh200.
    With 2 shared prompt slots (sampling.continuous_prompt_slots) the lanes
    hold no prompt copies: the KV cache drops by (4 lanes - 2 slots) x P tokens."""
    from gdpo_jax.scale.plan import format_plan, make_plan

    plans = {}
    for w in (0, 2):
        c = tiny_config()
        c.mesh.axis_types = "explicit"
        c.sampling.continuous_slots = 4
        c.sampling.continuous_prompt_slots = w
        c.model.dtype = "bfloat16"  # one GPU in bf16: the Sampler's fused decode, planned so
        plans[w] = make_plan(c, targets_lib.parse_target("1xh100"))
        gen = plans[w]["programs"]["generate"]
        assert gen["compiled"] and gen["decode"] == "continuous"
        assert gen["decode_layers"] == "fused"
        # One device: 4 lanes, nothing gathered.
        assert gen["lanes_per_shard"] == 4 and gen["gathered_params_bytes"] == 0
        assert gen["prompt_slots_per_shard"] == w
        # Its cache grows in the decode's phases too: 16 new tokens are one phase.
        assert gen["decode_phases"] == 1 and "1 phase (sampling.decode_phases)" in (
            format_plan(plans[w])
        )
    per_token = 2 * L * HKV * DH * 2  # k and v, bf16
    drop = plans[0]["per_device"]["kv_cache"] - plans[2]["per_device"]["kv_cache"]
    assert drop == per_token * (4 - 2) * c.sampling.max_prompt_len
    assert "2 shared prompt slots (sampling.continuous_prompt_slots)" in format_plan(plans[2])
    assert "a prompt copy per lane" in format_plan(plans[0])
    # The decode roofline: each step's lanes read 2 prompts' P slots, not 4 (prompt_share
    # 4 / 2): per call, C steps x rows x (P / 1 - P / 2) KV tokens fewer.
    roof = {w: plans[w]["roofline"] for w in plans}
    assert roof[0]["bound"]["decode"] == roof[2]["bound"]["decode"] == "memory"
    rows, m = c.algo.num_prompts * c.algo.group_size, c.sampling.max_new_tokens
    saved = m * rows * per_token * c.sampling.max_prompt_len / 2
    bw = targets_lib.parse_target("1xh100").chip.hbm_bw
    assert roof[0]["decode"] - roof[2]["decode"] == pytest.approx(saved / bw, rel=1e-9)


@needs_cuda
def test_one_gpu_bf16_roofline_counts_the_fused_decodes_bf16_weights():
    """On one GPU in bf16 the Sampler decodes in the fused form over a bf16 copy
    of the f32 weights; the roofline counted the f32 weights at every step, and
    the planner ignored sampling.decode_layers (it planned auto's pick)."""
    from gdpo_jax.scale.plan import format_plan, make_plan

    plans = {}
    for layers in ("scan", "auto"):
        c = tiny_config()
        c.model.dtype = "bfloat16"  # f32 storage (param_dtype), bf16 compute
        c.sampling.decode_layers = layers
        plans[layers] = make_plan(c, targets_lib.parse_target("1xh100"))
    assert plans["auto"]["programs"]["generate"]["decode_layers"] == "fused"
    assert plans["auto"]["programs"]["generate"]["decode_phases"] == 1  # 16 new tokens
    assert "static decode, 32 rows per call, 1 phase (sampling.decode_phases), layers fused" in (
        format_plan(plans["auto"])
    )
    assert "layers scan (sampling.decode_layers)" in format_plan(plans["scan"])
    f32 = (n_matrix() + n_vector()) * 4  # hand count; the copy is half of it
    bf16 = f32 // 2
    bw = targets_lib.parse_target("1xh100").chip.hbm_bw
    calls, steps = 1, 16  # 32 rows in one call; max_new_tokens
    scan, fused = plans["scan"]["roofline"], plans["auto"]["roofline"]
    assert scan["bound"]["decode"] == fused["bound"]["decode"] == "memory"
    # Per call: the copy (read f32, write bf16), then every step reads bf16 not f32.
    want = calls * ((f32 + bf16) + steps * (bf16 - f32)) / bw
    assert fused["decode"] - scan["decode"] == pytest.approx(want, rel=1e-9)
    assert fused["prefill"] - scan["prefill"] == pytest.approx(calls * (bf16 - f32) / bw)


def _compiled_decode(
    target_name: str, phases: int, growth: str, new_tokens: int = 256, continuous_slots: int = 0
):
    """(temporaries in bytes, optimized HLO text, rows, DecodeSpec) of a tiny
    config's compiled sampler for a target: 256 rows, `new_tokens`, 8 layers
    (continuous batching's program with `continuous_slots` lanes)."""
    from flax import nnx

    from gdpo_jax.backend import target_backend
    from gdpo_jax.scale.arch import model_config
    from gdpo_jax.scale.lowering import _abstract_state, _generate_lowering
    from gdpo_jax.train import mesh as mesh_lib

    target = targets_lib.parse_target(target_name)
    devices = targets_lib.target_devices(target)
    mesh = mesh_lib.make_mesh((1, -1, 1), axis_types="explicit", devices=devices)  # as runs
    c = tiny_config(num_prompts=64)  # 256 rows: a cache large beside the rest
    c.model.tiny.update(num_layers=8, max_position_embeddings=256 + new_tokens)
    c.sampling.max_new_tokens = new_tokens
    c.sampling.update(decode_phases=phases, decode_growth=growth, continuous_slots=continuous_slots)
    mc = model_config(c)
    *_, full, _tx, _sched, _sc, model = _abstract_state(c, mc, mesh)
    with target_backend(target.platform):  # the target's decode form, as the planner
        lower, rows, spec = _generate_lowering(c, nnx.graphdef(model), full, mesh, 256)
        compiled = lower().compile()  # under the call's mesh (none: continuous, one device)
    return compiled.memory_analysis().temp_size_in_bytes, compiled.as_text(), rows, spec


@needs_cuda
def test_decode_phases_and_growth_reach_the_compiled_sampler_and_prefix_holds_one_cache():
    """sampling.decode_phases and decode_growth are the run's Sampler's, and the
    planner compiles that decode. On XLA:GPU the phases' growth copies hold more
    temporaries than one cache of all slots (about a quarter of the cache here);
    "prefix" growth (the GPU's default) holds what one phase does."""
    temps = {}
    for phases, growth in ((0, "copy"), (0, "auto"), (1, "auto")):  # 0: 4 phases of 64
        temps[phases, growth], _, rows, spec = _compiled_decode("cuda:1x1x1:h100", phases, growth)
        assert spec.chunks == ((64,) * 4 if phases == 0 else (256,))
        assert spec.growth == ("copy" if growth == "copy" else "prefix")
    # The rows' own slots (the prompt's are shared: 16 slots per prompt), f32 k and v.
    cache = 2 * 8 * HKV * DH * 4 * (rows * 256 + 64 * 16)
    one = temps[1, "auto"]
    assert cache < one < temps[0, "copy"] - cache // 8
    assert abs(temps[0, "auto"] - one) < cache // 64


@needs_cuda
def test_continuous_batching_phases_grown_by_copies_hold_more_than_one_phase():
    """Continuous batching's lanes grow their cache in the decode's phases too: by
    copies (sampling.decode_growth=copy) the step into a phase holds the old cache
    beside the new one, so the search's one-phase candidate saves memory there as
    it does for the static decode (it was offered to the static decode only)."""
    temps = {}
    for phases in (0, 1):  # 0: 4 phases of 64
        temps[phases], _, _, spec = _compiled_decode("1xh100", phases, "copy", continuous_slots=128)
        assert spec.chunks == ((64,) * 4 if phases == 0 else (256,)) and spec.growth == "copy"
    # 128 lanes of P + M = 16 + 256 slots (each lane a prompt copy), f32 k and v.
    cache = 2 * 8 * HKV * DH * 4 * 128 * (16 + 256)
    assert temps[1] > cache and temps[0] - temps[1] > cache // 4  # the last copy: 3/4 cache


@pytest.mark.slow  # two TPU compiles of the sampler
@needs_tpu
def test_tpu_prefix_growth_reads_each_phases_slots_and_holds_one_cache():
    """On a TPU the phases' growth copies keep about one more cache alive; the
    "prefix" growth holds one cache of all slots, and each phase's steps read
    only its slots: the compiled program slices a layer's 256 / 512 / 768
    slots out of the 1024, as the copies' program reads its 256 / 512 /
    768-slot caches (a step before the last phase never reads all 1024)."""
    import re
    from collections import Counter

    temps, hlo = {}, {}
    for growth in ("copy", "prefix"):
        temps[growth], hlo[growth], rows, spec = _compiled_decode("tpu:v5p:2x2x1", 0, growth, 1024)
        assert spec.growth == growth and spec.chunks == (256,) * 4
    cache = 2 * 8 * HKV * DH * 2 * (rows * 1024 + 64 * 16) // 4  # bf16 k and v, per device
    assert temps["prefix"] < temps["copy"] - cache // 2
    # A step's read of a layer's k: [1, rows per device, Hkv, Dh, S_j], S_j the
    # phase's slots. The same reads, of the same sizes, in both programs (a
    # prefix read as a slice of all 1024 slots would show 1024s instead).
    reads = {
        g: Counter(re.findall(rf"bf16\[1,{rows // 4},{HKV},{DH},(\d+)\]", hlo[g])) for g in hlo
    }
    assert {"256", "512", "768", "1024"} <= set(reads["copy"])
    assert reads["prefix"] == reads["copy"]


def test_search_halves_continuous_slots_first_for_the_sampler():
    from gdpo_jax.scale.search import candidates

    c = tiny_config()
    c.sampling.continuous_slots = 8
    knobs = candidates(c, "generate", 4)
    assert knobs[:3] == [{"sampling.continuous_slots": n} for n in (4, 2, 1)]
    c.sampling.continuous_slots = 0
    assert not any("sampling.continuous_slots" in k for k in candidates(c, "generate", 4))
    # 32 rows over 4 devices: 8 per shard. 64 slots decode those 8 all the same; halving
    # to 32 and 16 recompiled the same program, so the halvings start from the 8 lanes.
    c.sampling.continuous_slots = 64
    knobs = candidates(c, "generate", 4)
    assert knobs[:3] == [{"sampling.continuous_slots": n} for n in (4, 2, 1)]


def test_model_attention_reaches_the_planned_model():
    from gdpo_jax.scale.arch import model_config

    c = tiny_config()
    c.model.attention = "dpa"
    assert model_config(c).attention == "dpa"  # was silently "auto"


@needs_cuda
def test_gpu_plan_uses_the_gpu_kernel_choice():
    # Kernels follow the target: "auto" in bf16 on a GPU is cuDNN flash attention;
    # without cuDNN on the planning host it is planned with the XLA kernel and says so.
    from gdpo_jax.scale.plan import PlanError, _cudnn_on_host, make_plan

    target = targets_lib.parse_target("cuda:1x1x2:h100")
    c = tiny_config()
    c.model.dtype = "bfloat16"
    plan = make_plan(c, target)
    assert plan["programs"]["generate"]["decode_layers"] == "scan"  # 2 GPUs keep the scan
    if _cudnn_on_host():
        assert plan["attention"] == "cudnn"
    else:
        assert plan["attention"] == "xla" and "cuDNN" in plan["attention_note"]
        c.model.attention = "cudnn"
        with pytest.raises(PlanError, match="nvidia-cudnn-cu12"):
            make_plan(c, target)
    c.model.attention = "dpa"  # jax.nn.dot_product_attention's XLA kernel, for the GPU
    assert make_plan(c, target)["attention"] == "dpa"


# ------------------------------------------------------------------------ CLI
def test_cli_unknown_topology_exits_with_the_names():
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.plan",
            "--config=configs/tiny_cpu.py",
            "--topology=v5p-7",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2
    assert "v5p-8" in r.stderr and "8xh100" in r.stderr


def test_planner_env_does_not_start_distributed(monkeypatch):
    """TPU_WORKER_HOSTNAMES=localhost (set for libtpu's compile-only use) is one host."""
    from gdpo_jax import multihost
    from gdpo_jax.train import distributed

    called = []
    monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda **kw: called.append(kw))
    for k in multihost._ENV_HINTS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")
    assert distributed.initialize("auto") is False and not called
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "10.0.0.1,10.0.0.2")  # a real pod slice
    assert distributed.initialize("auto") is True and called == [{}]


def test_paper_qwen3_sampler_cache_fits_an_80gb_gpu():
    """The planner found math:qwen3-4b's 512-row sampler calls need 79 GiB of KV
    cache per device on 8 GPUs; the config now decodes fewer rows per call."""
    import importlib.util as iu

    spec = iu.spec_from_file_location("paper_math", os.path.join(ROOT, "configs/paper_math.py"))
    mod = iu.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config("qwen3-4b")
    # bf16 k and v: 36 layers x 8 kv heads x 128 dims x 2 bytes x 2, per token and row.
    per_token = 36 * 8 * 128 * 2 * 2
    rows_per_device = c.sampling.rows_per_call // 8
    cache = rows_per_device * per_token * (c.sampling.max_prompt_len + c.sampling.max_new_tokens)
    assert cache <= 24 * 2**30  # room for the decode's temporaries on an 80 GB card


def test_oom_message_bytes():
    from gdpo_jax.scale.memory import oom_bytes

    msg = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
        "temporaries (30.31G) exceeds available HBM (15.75G)."
    )
    assert oom_bytes(msg) == int(30.31 * 2**30)
    assert oom_bytes("RESOURCE_EXHAUSTED: Used 120.5G of 95.74G hbm.") == int(120.5 * 2**30)
    assert oom_bytes("something else") == 0


def test_search_offers_one_decode_phase_after_the_row_halvings():
    from gdpo_jax.scale.search import candidates

    c = tiny_config()
    c.sampling.max_new_tokens = 128  # the Sampler's default: 4 phases
    knobs = [k for k in candidates(c, "generate", 4) if "mesh.shape" not in k]
    sampler = [k for k in knobs if any(path.startswith("sampling.") for path in k)]
    assert sampler == [
        *({"sampling.rows_per_call": n} for n in (16, 8, 4)),  # 32 rows, G = 4
        {"sampling.decode_phases": 1},
    ]
    assert knobs[: len(sampler)] == sampler  # the sampler's knobs first when it binds
    for one_phase in (
        dict(decode_phases=1),  # already one
        dict(max_new_tokens=32),  # the default is one phase
    ):
        c2 = tiny_config()
        c2.sampling.max_new_tokens = 128
        c2.sampling.update(one_phase)
        assert {"sampling.decode_phases": 1} not in candidates(c2, "generate", 4)
    # A decode whose phases read a prefix of one cache: one phase saves no memory.
    assert {"sampling.decode_phases": 1} not in candidates(c, "generate", 4, growth="prefix")
    # Continuous batching's phases grow by copies too: fewer lanes first, then one phase.
    c.sampling.continuous_slots = 8
    knobs = [
        k
        for k in candidates(c, "generate", 4)
        if "sampling.decode_phases" in k or "sampling.continuous_slots" in k
    ]
    assert knobs == [
        *({"sampling.continuous_slots": n} for n in (4, 2, 1)),
        {"sampling.decode_phases": 1},
    ]
    assert {"sampling.decode_phases": 1} not in candidates(c, "generate", 4, growth="prefix")


def test_search_orders_the_static_decode_knobs_by_their_roofline():
    """Halving sampling.rows_per_call doubles the calls (the weights read per
    step twice as often); one decode phase reads 8/5 the own KV slots of 4. The
    search tries whichever costs less first (it tried the halvings first, and
    the roofline counted every phase count's reads as equal)."""
    from gdpo_jax.scale.search import candidates, estimate

    c = tiny_config()
    c.sampling.max_new_tokens = 128  # 4 phases of 32
    rows = c.algo.num_prompts * c.algo.group_size
    target = targets_lib.parse_target("1xh100")

    def plan(param_bytes: int, kv_bytes_per_token: int) -> dict:
        shape = {
            **ROOFLINE_SHAPE,
            **dict(rows=rows, prompts=8, rows_per_call=rows, prompt_len=16, new_tokens=128),
            **dict(param_bytes=param_bytes, kv_bytes_per_token=kv_bytes_per_token),
        }
        return {"step_shape": {**shape, "decode_chunks": (32, 32, 32, 32)}}

    def sampler_order(p: dict) -> list[dict]:
        cost = lambda cfg: estimate(cfg, p, target)  # noqa: E731
        knobs = candidates(c, "generate", 1, cost)
        return [k for k in knobs if any(path.startswith("sampling.") for path in k)]

    one_phase = {"sampling.decode_phases": 1}
    assert sampler_order(plan(10**12, 1))[0] == one_phase  # weight reads dominate
    assert sampler_order(plan(1, 10**9))[-1] == one_phase  # KV reads dominate
    # The estimate of the config itself is the plan's roofline (nothing changed) ...
    p = plan(10**6, 10**3)
    shape = flops_lib.StepShape(**p["step_shape"])
    mc, chip = ModelConfig.tiny(**c.model.tiny), target.chip
    roof = lambda s: flops_lib.roofline(  # noqa: E731
        mc, s, num_devices=1, peak_flops=chip.peak_flops, hbm_bw=chip.hbm_bw
    )["total"]
    assert estimate(c, p, target) == pytest.approx(roof(shape), rel=1e-12)
    # ... and one phase adds the slots its early steps read: 128 steps x 32 rows x
    # 1000 B x (128 - 80) own slots on average.
    c1 = c.copy_and_resolve_references()
    c1.sampling.decode_phases = 1
    extra = 128 * rows * 10**3 * (128 - 80) / chip.hbm_bw
    assert estimate(c1, p, target) - roof(shape) == pytest.approx(extra, rel=1e-9)


def test_search_offers_remat_keeping_the_products_before_whole_layers():
    """Without remat the step's knobs start with remat keeping the weight products
    (cheaper in time), then re-running whole layers; with "dots" on, "full" is the
    step further; with "full" on, no remat knob is left."""
    from gdpo_jax.scale.search import candidates

    c = tiny_config()
    assert candidates(c, "step", 8)[:2] == [
        {"model.remat": True, "model.remat_policy": "dots"},
        {"model.remat": True, "model.remat_policy": "full"},
    ]
    c.model.remat, c.model.remat_policy = True, "dots"
    assert candidates(c, "step", 8)[0] == {"model.remat_policy": "full"}
    c.model.remat_policy = "full"
    assert not any(
        "model.remat" in k or "model.remat_policy" in k for k in candidates(c, "step", 8)
    )


def test_search_offers_prompt_sharing_off_last_for_the_step():
    from gdpo_jax.scale.search import candidates

    c = tiny_config()
    step_knobs = candidates(c, "step", 8)
    assert c.algo.share_prompt and {"algo.share_prompt": False} in step_knobs
    train = [k for k in step_knobs if "mesh.shape" not in k and "sampling.rows_per_call" not in k]
    assert train[-1] == {"algo.share_prompt": False}
    c.algo.share_prompt = False
    assert {"algo.share_prompt": False} not in candidates(c, "step", 8)


def test_fewest_microbatches_halves_while_the_plan_fits(monkeypatch):
    """The search down: halve algo.num_microbatches while a (fake) plan fits, stop at the
    first count that does not; None when the config's count cannot be halved or the
    plan does not fit to begin with."""
    from gdpo_jax.scale import search

    planned = []

    def fake_plan(cfg, target):
        micro = cfg.algo.num_microbatches
        planned.append(micro)
        return {
            "fits": micro >= 4,
            "peak_gib": 64 / micro,
            "peak_program": "step",
            "est_step_s": 1.0,
        }

    monkeypatch.setattr(search, "make_plan", fake_plan)
    target = targets_lib.parse_target("tpu:v5e:2x2")
    fits = {"fits": True}
    logged = []
    got = search.fewest_microbatches(
        tiny_config(num_microbatches=16), target, fits, log=logged.append
    )
    assert planned == [8, 4, 2]  # 2 does not fit: the search stops there
    assert got["changes"] == {"algo.num_microbatches": 4} and got["tries"] == 3
    assert got["overrides"] == ["--config.algo.num_microbatches=4"] and got["peak_gib"] == 16
    assert "does not fit" in logged[-1] and "num_microbatches=2" in logged[-1]
    planned.clear()
    assert search.fewest_microbatches(tiny_config(num_microbatches=4), target, fits) is None
    assert planned == [2]
    assert (
        search.fewest_microbatches(tiny_config(num_microbatches=16), target, {"fits": False})
        is None
    )
    assert search.fewest_microbatches(tiny_config(num_microbatches=1), target, fits) is None
    assert planned == [2]  # neither planned anything


@needs_tpu
def test_fewest_microbatches_on_a_tpu_target():
    """Compiled for a v5e: the tiny config fits at every count, so 4 micro-batches halve to 1,
    and the plan of the count it names fits."""
    from gdpo_jax.scale.plan import make_plan
    from gdpo_jax.scale.search import _apply, fewest_microbatches

    cfg, target = tiny_config(num_microbatches=4), targets_lib.parse_target("tpu:v5e:2x2")
    got = fewest_microbatches(cfg, target, make_plan(cfg, target))
    assert got["changes"] == {"algo.num_microbatches": 1} and got["tries"] == 2
    assert make_plan(_apply(cfg, got["changes"]), target)["fits"]


def _logprob_hlo(cfg) -> str:
    """The log-prob program's StableHLO for `cfg` on this host's CPU devices."""
    import jax

    from gdpo_jax.scale.arch import model_config
    from gdpo_jax.scale.lowering import abstract_step
    from gdpo_jax.train import mesh as mesh_lib

    mesh = mesh_lib.make_mesh(tuple(cfg.mesh.shape), devices=jax.devices()[:4])
    run = abstract_step(cfg, model_config(cfg), mesh)
    return run.step.lower_logprobs(run.state.params, run.batch).as_text()


@pytest.mark.parametrize(
    "field,value",
    [("share_prompt", False), ("num_microbatches", 2), ("num_minibatches", 2)],
)
def test_a_knob_that_changes_the_logprob_program_changes_its_cache_key(field, value):
    # The search re-plans only the programs whose key (plan._DEPENDS) a change
    # touches. algo.share_prompt was missing from the log-prob program's: the
    # search's "share_prompt off" candidate reused the shared-prompt log-prob plan.
    from gdpo_jax.scale import plan as plan_lib

    target = targets_lib.parse_target("v5p-8")
    base = tiny_config()
    base.mesh.shape = (1, 4, 1)
    changed = tiny_config(**{field: value})
    changed.mesh.shape = (1, 4, 1)
    assert _logprob_hlo(base) != _logprob_hlo(changed)
    assert plan_lib._key("logprob", base, target) != plan_lib._key("logprob", changed, target)


@needs_cuda
@pytest.mark.parametrize("shared", [False, True])
def test_an_odd_prompt_bucket_trains_through_cudnn_on_a_gpu_target(shared):
    """A bf16 GPU run ("auto" -> cuDNN) whose prompt bucket is odd (max_prompt_len=68's
    bucket 17) failed the train step's compile: cuDNN's masked backward pass takes even
    lengths only. The gradient, per row and over shared prompts, now lowers with cuDNN's
    kernel in the module."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from gdpo_jax.backend import target_backend
    from gdpo_jax.models.prompt_sharing import shared_prompt_hidden
    from gdpo_jax.models.transformer import Transformer
    from gdpo_jax.scale.plan import _cudnn_on_host

    if not _cudnn_on_host():
        pytest.skip("lowering cuDNN's kernel needs cuDNN on this host")
    device = targets_lib.target_devices(targets_lib.parse_target("1xh100"))[0]
    sharding = jax.sharding.SingleDeviceSharding(device)

    def spec(shape, dtype=jnp.int32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    cfg = ModelConfig.tiny(dtype="bfloat16")
    graph, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    state = jax.tree.map(lambda a: spec(a.shape, a.dtype), state)
    P, C = 17, 16

    def loss(state, *batch):
        model = nnx.merge(graph, state)
        out = shared_prompt_hidden(model, *batch, group=2) if shared else model(*batch)
        return jnp.sum(out.astype(jnp.float32))

    batch = (spec((4, P)),) * 2 + (spec((4, C)),) * 2 if shared else (spec((4, P + C)),) * 2
    with target_backend("gpu"):
        text = jax.jit(jax.grad(loss)).lower(state, *batch).as_text()
    assert "__cudnn$fmha" in text


@needs_cuda
def test_a_cudnn_head_dim_out_of_range_is_a_plan_error():
    """An explicit cudnn with a head dim cuDNN cannot take: one line from the planner
    (a ValueError traceback from the kernel choice)."""
    from gdpo_jax.scale.plan import PlanError, make_plan

    c = tiny_config()
    c.model.dtype, c.model.attention = "bfloat16", "cudnn"
    c.model.tiny.head_dim = 12
    with pytest.raises(PlanError, match="head_dim that is a multiple of 8"):
        make_plan(c, targets_lib.parse_target("cuda:1x1x2:h100"))
