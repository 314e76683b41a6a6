"""benchmarks/profile_decode_ops: HLO instructions are named after what they compute
(weight products by output width, attention dots by einsum, YNNPACK reductions),
and a trace's milliseconds are summed per step by those names."""

# ruff: noqa: E501 (the HLO excerpt below keeps its lines as long as XLA writes them)
from __future__ import annotations

import pytest

from benchmarks import bench_sampler, profile_decode_ops, xla_trace
from benchmarks.xla_trace import op_ms
from tests._perfetto import write_trace

# A hand-written excerpt of an optimized XLA:CPU module (one decode layer's kinds).
HLO = """
HloModule jit_generate, entry_computation_layout={()}
%fused_computation.1 (param_0: f32[64,256]) -> f32[64,512] {
  %param_0 = f32[64,256]{1,0} parameter(0)
}
ENTRY %main {
  %a = f32[64,256]{1,0} parameter(0)
  %b = f32[256,512]{1,0} parameter(1)
  %ynn_fusion.7 = f32[64,512]{1,0} fusion(%a, %b), kind=kCustom, calls=%fc.7, metadata={op_name="jit(generate)/while/body/...d,df->...f/dot_general" stack_frame_id=3}, backend_config={}
  %ynn_fusion.8 = f32[64,2,2,128]{3,2,1,0} fusion(%c, %d), kind=kCustom, metadata={op_name="jit(generate)/while/body/bkqd,bkds->bkqs/dot_general" stack_frame_id=4}
  %ynn_fusion.9 = f32[64,2,2,64]{3,2,1,0} fusion(%e, %f), kind=kCustom, metadata={op_name="jit(generate)/while/body/bkqs,bksd->bkqd/dot_general" stack_frame_id=5}
  %ynn_fusion.10 = f32[8,2,16,32]{3,2,1,0} fusion(%g, %h), kind=kCustom, metadata={op_name="jit(generate)/while/body/ukmd,ukds->ukms/dot_general"}
  %ynn_fusion.11 = f32[64,2,2,1]{3,2,1,0} fusion(%i), kind=kCustom, metadata={op_name="jit(generate)/while/body/reduce_max" stack_frame_id=6}
  %ynn_fusion.12 = f32[64,256]{1,0} fusion(%j, %k), kind=kCustom, metadata={op_name="jit(generate)/while/body/...d,df->...f/dot_general"}
  %ynn_fusion.13 = f32[64,1536]{1,0} fusion(%l, %m), kind=kCustom, metadata={op_name="jit(generate)/while/body/...d,df->...f/dot_general"}
  %ynn_fusion.14 = f32[64,2048]{1,0} fusion(%n, %o), kind=kCustom, metadata={op_name="jit(generate)/while/body/...d,df->...f/dot_general"}
  %ynn_fusion.15 = f32[64,768]{1,0} fusion(%n, %o), kind=kCustom, metadata={op_name="jit(generate)/...d,df->...f/dot_general"}
  %add_bitcast_fusion.2 = f32[64,256]{1,0} fusion(%p, %q), kind=kLoop, metadata={op_name="jit(generate)/while/body/add"}
  ROOT %multiply_fusion = f32[64,256]{1,0} fusion(%r), kind=kLoop, metadata={op_name="jit(generate)/while/body/reduce_max/mul"}
}
"""


def test_instructions_are_named_after_what_they_compute() -> None:
    widths = profile_decode_ops.weight_widths(bench_sampler.HF_CONFIG)
    # bench_sampler's model: 4 q + 2 k + 2 v heads of 64; hidden 256; 2 x 768; vocab 2048
    assert widths == {
        512: "q/k/v (fused)",
        256: "o and down projections",
        1536: "gate/up (fused)",
        2048: "unembedding",
    }
    got = profile_decode_ops.categorize(HLO, widths)
    assert got == {
        "ynn_fusion.7": "q/k/v (fused)",
        "ynn_fusion.8": "attention, own slots: q @ k",
        "ynn_fusion.9": "attention, own slots: p @ v",
        "ynn_fusion.10": "attention, shared prompt: q @ k",
        "ynn_fusion.11": "reductions (YNNPACK)",
        "ynn_fusion.12": "o and down projections",
        "ynn_fusion.13": "gate/up (fused)",
        "ynn_fusion.14": "unembedding",
        "ynn_fusion.15": "weight products, other widths",
        "add_bitcast_fusion.2": "other",
        # Not a YNNPACK fusion: a loop fusion under a reduction's name stays "other".
        "multiply_fusion": "other",
    }


def test_trace_milliseconds_are_summed_per_step_by_category(tmp_path) -> None:
    events = [
        {"ph": "X", "name": "ynn_fusion.7", "dur": 3000},
        {"ph": "X", "name": "ynn_fusion.7", "dur": 1000},
        {"ph": "X", "name": "ynn_fusion.8", "dur": 2000},
        {"ph": "X", "name": "add_bitcast_fusion.2", "dur": 500},
        {"ph": "X", "name": "copy.3", "dur": 1500},  # not in the HLO: "other"
        {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 99000},  # a frame: skipped
        {"ph": "X", "name": "$sampler.py:202 generate", "dur": 99000},
    ]
    write_trace(tmp_path, events)
    ops = op_ms(str(tmp_path))
    cats = profile_decode_ops.categorize(
        HLO, profile_decode_ops.weight_widths(bench_sampler.HF_CONFIG)
    )
    got = profile_decode_ops.by_category(ops, cats, steps=2)
    assert got == {"q/k/v (fused)": 2.0, "other": 1.0, "attention, own slots: q @ k": 1.0}
    assert xla_trace.other_kinds(ops, cats, steps=2) == {
        "copy": 0.75,
        "add_bitcast_fusion": 0.25,
    }
    res = {
        "rows": 64,
        "new_tokens": 2,
        "traced_ms_per_step": 4.0,
        "wall_best_ms_per_step": 3.5,
        "wall_median_ms_per_step": 3.6,
        "summed_ms_per_step": 4.5,
        "ms_per_step": got,
        "gflops": {"q/k/v (fused)": 8.4},
        "other_kinds_ms_per_step": {"copy": 0.75},
    }
    table = profile_decode_ops.table_markdown(res)
    assert "| q/k/v (fused) | 2.00 | 50% | 8 |" in table
    assert "| other | 1.00 | 25% |  |" in table
    assert "their durations sum to 4.50" in table
    assert "untraced calls 3.50 ms per step (best)" in table


def test_weight_products_rates_come_from_the_hlo_shapes() -> None:
    """q/k/v's product x[64,256] @ w[256,512], twice in 4 ms: its GFLOP/s; the other
    products' operands are not defined in the excerpt, so they get none."""
    cats = profile_decode_ops.categorize(
        HLO, profile_decode_ops.weight_widths(bench_sampler.HF_CONFIG)
    )
    ops = {"ynn_fusion.7": 4.0, "ynn_fusion.12": 1.0, "ynn_fusion.8": 1.0}
    calls = {"ynn_fusion.7": 2, "ynn_fusion.12": 1, "ynn_fusion.8": 1}
    got = profile_decode_ops.rates(ops, calls, cats, HLO)
    assert got == {"q/k/v (fused)": round(2 * (2 * 64 * 256 * 512) / 4.0 / 1e6, 1)}


def test_a_missing_hlo_dump_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="--xla_dump_to"):
        xla_trace.module_hlo(str(tmp_path), profile_decode_ops.MODULE, {"ynn_fusion.1"})


def test_the_traced_model_is_the_one_whose_widths_name_the_products() -> None:
    """run() traces profile_decode's "bench_sampler's model" and names its products by
    bench_sampler.HF_CONFIG's widths: the two must describe the same model."""
    from benchmarks.profile_decode import MODELS

    shape, hf = MODELS["bench_sampler's model"]["shape"], bench_sampler.HF_CONFIG
    assert (shape["vocab_size"], shape["hidden_size"], shape["intermediate_size"]) == (
        hf["vocab_size"],
        hf["hidden_size"],
        hf["intermediate_size"],
    )
    assert (shape["num_heads"], shape["num_kv_heads"], shape["head_dim"]) == (
        hf["num_attention_heads"],
        hf["num_key_value_heads"],
        hf["head_dim"],
    )
    assert shape["num_layers"] == hf["num_hidden_layers"]
