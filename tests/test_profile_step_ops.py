"""benchmarks/profile_step_ops and benchmarks/xla_trace: the step's HLO instructions
are named after what they compute (the weight products by einsum, XLA's generic dots,
attention, transposes, reductions), concurrent operations share their time, and the
weight products' FLOP/s come from the HLO's shapes."""

# ruff: noqa: E501 (the HLO excerpt below keeps its lines as long as XLA writes them)
from __future__ import annotations

import numpy as np
import pytest

from benchmarks import profile_step_ops as S
from benchmarks import xla_trace
from tests._bench_run import run_quick
from tests._perfetto import write_trace

# A hand-written excerpt of an optimized XLA:CPU train_step module (one layer's kinds).
HLO = """
HloModule jit_train_step, entry_computation_layout={()}
%fused_computation.67 (param_0.4: f32[256,1024], param_1.5: f32[1024,640]) -> f32[256,640] {
  %param_0.4 = f32[256,1024]{1,0} parameter(0)
  %param_1.5 = f32[1024,640]{1,0} parameter(1)
  ROOT %dot.1060 = f32[256,640]{1,0} dot(%param_0.4, %param_1.5), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(train_step)/while/body/transpose(jvp(d...,...f->df))/dot_general"}
}
ENTRY %main {
  %x = f32[1024,256]{1,0} get-tuple-element(%p), index=0
  %w = f32[256,640]{1,0} get-tuple-element(%p), index=1
  %g = f32[1024,640]{1,0} get-tuple-element(%p), index=2
  %xt = f32[256,1024]{1,0} get-tuple-element(%p), index=3
  %ynn_fusion.1 = f32[1024,640]{1,0} fusion(%x, %w), kind=kCustom, calls=%fc.1, metadata={op_name="jit(train_step)/while/body/closed_call/jvp(...d,df->...f)/dot_general" stack_frame_id=3}, backend_config={}
  %ynn_fusion.2 = f32[1024,256]{1,0} fusion(%g, %w), kind=kCustom, calls=%fc.2, metadata={op_name="jit(train_step)/while/body/closed_call/transpose(jvp())/...f,df->...d/dot_general"}
  %ynn_fusion.3 = f32[256,640]{1,0} fusion(%xt, %g), kind=kCustom, calls=%fused_computation.67, metadata={op_name="jit(train_step)/while/body/transpose(jvp(d...,...f->df))/dot_general"}
  %dot.917 = f32[2,2,9,64]{3,2,1,0} dot(%copy_bitcast_fusion.54, %copy_bitcast_fusion.50), lhs_batch_dims={0,1}, lhs_contracting_dims={2}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}, metadata={op_name="jit(train_step)/while/body/transpose(jvp(ukms,uksd->ukmd))/transpose"}
  %ynn_fusion.4 = f32[16,2,128,64]{3,2,1,0} fusion(%q, %k), kind=kCustom, metadata={op_name="jit(train_step)/while/body/jvp(bkqd,bkds->bkqs)/dot_general"}
  %copy_bitcast_fusion.24 = f32[256,1024]{1,0} fusion(%copy_rsqrt_fusion.15, /*index=1*/%get-tuple-element.2289), kind=kLoop, calls=%fused_computation.341, metadata={op_name="jit(train_step)/while/body/closed_call/transpose(jvp())/transpose"}
  %ynn_fusion.5 = f32[16,64]{1,0} fusion(%a), kind=kCustom, metadata={op_name="jit(train_step)/while/body/jvp()/reduce_sum"}
  %add_bitcast_fusion.2 = f32[1024,256]{1,0} fusion(%b, %c), kind=kLoop, metadata={op_name="jit(train_step)/while/body/transpose(jvp())/add_any"}
  %multiply_fusion.3 = f32[1024,256]{1,0} fusion(%d), kind=kLoop, metadata={op_name="jit(train_step)/while/body/reduce_sum/mul"}
}
"""


def test_step_instructions_are_named_after_what_they_compute() -> None:
    got = S.categorize(HLO)
    assert got == {
        "ynn_fusion.1": S.FORWARD,
        "ynn_fusion.2": S.INPUT_GRAD,
        "ynn_fusion.3": S.WEIGHT_GRAD,
        # a fused computation's root: never a traced operation, and a dot all the same
        "dot.1060": S.GENERIC_DOTS,
        # the prompt values' gradient, contracting their rows: XLA's own dot
        "dot.917": S.GENERIC_DOTS,
        "ynn_fusion.4": S.ATTENTION,
        "copy_bitcast_fusion.24": S.TRANSPOSES,
        "ynn_fusion.5": S.REDUCTIONS,
        "add_bitcast_fusion.2": S.OTHER,
        # not a YNNPACK fusion: a loop fusion under a reduction's name stays "other"
        "multiply_fusion.3": S.OTHER,
    }  # the get-tuple-elements and parameters carry no op_name: not named


def test_weight_product_flops_come_from_the_shapes() -> None:
    table = xla_trace.instructions(HLO)
    assert table["ynn_fusion.3"].operands == ("xt", "g")
    assert table["copy_bitcast_fusion.24"].operands == (
        "copy_rsqrt_fusion.15",
        "get-tuple-element.2289",
    )
    # x[1024,256] @ w[256,640]; dY[1024,640] @ wᵀ; xᵀ[256,1024] @ dY[1024,640]
    assert xla_trace.dot_flops(table["ynn_fusion.1"], table) == 2 * 1024 * 256 * 640
    assert xla_trace.dot_flops(table["ynn_fusion.2"], table) == 2 * 1024 * 640 * 256
    assert xla_trace.dot_flops(table["ynn_fusion.3"], table) == 2 * 256 * 1024 * 640
    # one operand, or operands the module does not define: unknown
    assert xla_trace.dot_flops(table["ynn_fusion.5"], table) is None
    assert xla_trace.dot_flops(table["ynn_fusion.4"], table) is None
    # |A| |B| / |C| not a square: not a plain product
    odd = xla_trace.Instr((3, 5), "fusion", ("x", "w"), "")
    assert xla_trace.dot_flops(odd, table) is None


def test_concurrent_operations_share_their_time(tmp_path) -> None:
    events = [
        {"ph": "X", "name": "ynn_fusion.1", "ts": 0, "dur": 4000},  # 0-4 ms
        {"ph": "X", "name": "ynn_fusion.2", "ts": 2000, "dur": 4000},  # 2-6 ms, 2 ms shared
        {"ph": "X", "name": "ynn_fusion.1", "ts": 10000, "dur": 1000},  # alone
        {"ph": "X", "name": "ThunkExecutor::Execute", "ts": 0, "dur": 99000},  # a frame
    ]
    write_trace(tmp_path, events)
    assert xla_trace.op_ms(str(tmp_path)) == {"ynn_fusion.1": 5.0, "ynn_fusion.2": 4.0}
    shared = xla_trace.op_ms_shared(str(tmp_path))
    assert shared == pytest.approx({"ynn_fusion.1": 2 + 1 + 1, "ynn_fusion.2": 1 + 2})
    assert sum(shared.values()) == pytest.approx(7.0)  # the time any operation ran
    assert xla_trace.op_calls(str(tmp_path)) == {"ynn_fusion.1": 2, "ynn_fusion.2": 1}
    # one read of the trace gives the same three
    assert xla_trace.op_times(str(tmp_path)) == (
        shared,
        xla_trace.op_ms(str(tmp_path)),
        xla_trace.op_calls(str(tmp_path)),
    )


def test_summary_per_category_with_the_weight_products_rates() -> None:
    ops = {
        "ynn_fusion.1": 4.0,  # ms over 2 steps
        "ynn_fusion.3": 2.0,
        "dot.917": 1.0,
        "add_bitcast_fusion.2": 0.6,
        "copy.9": 0.4,  # not in the HLO: other
    }
    calls = {"ynn_fusion.1": 4, "ynn_fusion.3": 2}
    got = S.summarize(ops, calls, HLO, steps=2)
    assert got["ms_per_step"] == {
        S.FORWARD: 2.0,
        S.WEIGHT_GRAD: 1.0,
        S.GENERIC_DOTS: 0.5,
        S.OTHER: 0.5,
    }
    f = 2 * 1024 * 256 * 640
    assert got["gflops"] == {
        S.FORWARD: round(4 * f / 4.0 / 1e6, 1),
        S.WEIGHT_GRAD: round(2 * f / 2.0 / 1e6, 1),
    }
    assert got["weight_gflop_per_step"] == round(6 * f / 2 / 1e9, 3)
    assert got["products"][0] == {
        "category": S.FORWARD,
        "out": "1024x640",
        "k": 256,
        "calls_per_step": 2.0,
        "ms_per_step": 2.0,
        "gflops": round(4 * f / 4.0 / 1e6, 1),
    }
    assert got["products"][1]["k"] == 1024  # xᵀ @ dY contracts the 1024 rows
    assert got["other_kinds_ms_per_step"] == {"add_bitcast_fusion": 0.3, "copy": 0.2}
    res = {
        **got,
        "beta": 0.0,
        "microbatches": 4,
        "traced_ms_per_step": 4.0,
        "summed_ms_per_step": 5.0,
        "wall_best_s": 0.0041,
        "wall_median_s": 0.0043,
    }
    table = S.table_markdown(res)
    assert f"| {S.FORWARD} | 2.0 | 50% | {4 * f / 4.0 / 1e6:.0f} |" in table
    assert f"| {S.GENERIC_DOTS} | 0.5 | 12% |  |" in table
    assert "untraced steps 4 ms (best), 4 (median)" in table
    assert "; bench_rl's step (beta 0, 4 micro-batches," in table  # runs before --model
    smol = S.table_markdown(dict(res, model="smollm2"))
    assert "; bench_rl's SmolLM2-135M step (beta 0, 4 micro-batches," in smol


def test_a_missing_step_dump_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="--xla_dump_to"):
        xla_trace.module_hlo(str(tmp_path), S.MODULE, {"ynn_fusion.1"})


@pytest.mark.slow
def test_quick_run_names_the_real_steps_products(tmp_path) -> None:
    """End to end on bench_rl's real step: the dumped HLO is found, every weight product
    is named with its FLOPs, the FLOPs are those of the model, and the parts add up to
    about the step's wall time."""
    from benchmarks import bench_rl

    res = run_quick("profile_step_ops", tmp_path)
    ms = res["ms_per_step"]
    assert set(S.WEIGHT_SPECS.values()) <= set(ms) and res["products_without_flops"] == 0
    assert sum(ms[k] for k in S.WEIGHT_SPECS.values()) > 0.3 * res["traced_ms_per_step"]
    assert res["traced_ms_per_step"] <= res["summed_ms_per_step"]
    assert 0.5 < res["traced_ms_per_step"] / 1e3 / res["wall_median_s"] < 2.0
    # Each product's contraction K, inferred from the HLO's shapes alone, is the model's:
    # forward [rows, F] with K = D_in, input gradient [rows, D_in] with K = F, weight
    # gradient [D_in, F] with K = rows, for (D_in, F) the shape of one of its weights.
    shape = bench_rl.SHAPES["tiny"]
    d, dh = shape.hidden, shape.hidden // shape.heads
    weights = {
        (d, shape.heads * dh),
        (d, shape.kv_heads * dh),
        (shape.heads * dh, d),
        (d, shape.inter),
        (shape.inter, d),
        (d, shape.vocab),
    }
    for p in res["products"]:
        rows, width = (int(x) for x in p["out"].split("x"))
        pair = {
            S.FORWARD: (p["k"], width),
            S.INPUT_GRAD: (width, p["k"]),
            S.WEIGHT_GRAD: (rows, width),
        }[p["category"]]
        assert pair in weights, p
    flops = sum(
        2 * p["calls_per_step"] * p["k"] * int(np.prod([int(x) for x in p["out"].split("x")]))
        for p in res["products"]
    )
    assert flops / 1e9 == pytest.approx(res["weight_gflop_per_step"], abs=1e-3)


@pytest.mark.slow
def test_quick_decode_ops_run_names_the_real_decodes_products(tmp_path) -> None:
    """End to end on bench_sampler's real decode (benchmarks/profile_decode_ops): the
    dumped HLO is found and the weight products and attention dots are named."""
    res = run_quick("profile_decode_ops", tmp_path)
    ms = res["ms_per_step"]
    for part in ("q/k/v (fused)", "gate/up (fused)", "unembedding", "attention, own slots: q @ k"):
        assert ms.get(part, 0) > 0, part
    assert ms.get("other", 0) < 0.6 * res["traced_ms_per_step"]
