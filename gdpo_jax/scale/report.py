"""Plain-text rendering of a plan (experiments/plan.py prints it)."""

from __future__ import annotations

from gdpo_jax.scale.targets import GIB


def format_plan(plan: dict) -> str:
    """A human-readable table of a plan."""
    hosts = plan.get("num_hosts")  # plans made before it was recorded lack it
    host_s = f" on {hosts} host{'' if hosts == 1 else 's'}" if hosts else ""
    lines = [
        f"target {plan['target']}: {plan['device']}{host_s}, mesh {plan['mesh']}, "
        f"{plan['num_params'] / 1e9:.3g}B params",
        f"{'program':<10}{'args':>10}{'out':>10}{'alias':>10}{'temp':>10}{'code':>10}"
        f"{'beside':>10}{'total':>10}  fits   (GiB per device; usable "
        f"{plan['usable_gib']:.1f} of {plan['device_memory_gib']:.1f})",
    ]
    for name, p in plan["programs"].items():
        g = lambda b: f"{b / GIB:10.2f}"  # noqa: E731
        # "code": the compiled program's own bytes, part of its total; a program the
        # compiler refused has no figure for it.
        lines.append(
            f"{name:<10}{g(p['args'])}{g(p['outputs'])}{g(p['aliased'])}"
            f"{g(p['temps'])}{g(p.get('code', 0))}{g(p['resident_bytes'])}{g(p['total_bytes'])}  "
            f"{'yes' if p['fits'] else 'NO'}" + ("" if p["compiled"] else f"  ({p['error'][:80]})")
        )
    lines.append("total = args + out - alias + temp + code + beside (each rounded)")
    pd = plan["per_device"]
    lines.append("per device: " + ", ".join(f"{k} {v / GIB:.2f}" for k, v in pd.items()) + " GiB")
    lines.append(
        f"fits: {'yes' if plan['fits'] else 'NO'}; peak {plan['peak_gib']:.2f} GiB in "
        f"{plan['peak_program']}; {plan['step_flops']:.3g} FLOPs per RL step; roofline "
        f"{plan['est_step_s']:.1f} s per step ("
        + ", ".join(
            f"{k} {plan['roofline'][k]:.1f}s {plan['roofline']['bound'][k]}"
            for k in ("prefill", "decode", "logprob", "train")
        )
        + ")"
    )
    gen = plan["programs"].get("generate")
    if gen:  # a plan of the training programs alone has no sampler line
        lines.append(_sampler_line(plan, gen))
    if plan.get("attention_note"):
        lines.append(plan["attention_note"])
    return "\n".join(lines)


def _sampler_line(plan: dict, gen: dict) -> str:
    """The sampler's decode design (the `generate` program's recorded choices)."""
    layers = f"layers {gen.get('decode_layers', '?')} (sampling.decode_layers)"
    phases = gen.get("decode_phases", "?")
    growth = (
        f", growth {gen.get('decode_growth', '?')} (sampling.decode_growth)" if phases != 1 else ""
    )
    grows = f"{phases} phase{'' if phases == 1 else 's'} (sampling.decode_phases){growth}"
    if gen.get("decode") == "continuous":
        return (
            f"sampler: continuous batching, {gen['lanes_per_shard']} lanes per batch shard "
            f"(sampling.continuous_slots={gen['slots']}), "
            + (
                f"{gen['prompt_slots_per_shard']} shared prompt slots "
                "(sampling.continuous_prompt_slots), "
                if gen.get("prompt_slots_per_shard")
                else "a prompt copy per lane, "
            )
            + f"{grows}, {layers}; weights gathered to every "
            f"device once per call: {gen['gathered_params_bytes'] / GIB:.2f} GiB of its "
            "temporaries"
        )
    asked = plan.get("step_shape", {}).get("rows_per_call", gen["rows_per_call"])
    rows = f"{asked} rows per call" + (
        f" (each call decodes {gen['rows_per_call']}: padded to the batch shards)"
        if asked != gen["rows_per_call"]
        else ""
    )
    return f"sampler: static decode, {rows}, {grows}, {layers}"
