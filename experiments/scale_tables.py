"""Renderers of docs/scale.md's and docs/models.md's tables of committed plans: each
reads one directory of docs/scale/ (plans made by `experiments.plan --json`, or runs by
`experiments.check_plan --json`), and `tests/test_docs.py` checks the page holds its
rendering. The paper configs' own table is `experiments.plan_table`'s."""

from __future__ import annotations

import glob
import json
import os


def committed(directory: str) -> list[tuple[list[str], dict]]:
    """([config, target, variant] from each <config>_<target>_<variant>.json file name,
    its plan) for every committed plan in `directory`, in name order."""
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path) as f:
            out.append((os.path.basename(path)[: -len(".json")].rsplit("_", 2), json.load(f)))
    return out


def attention_table(directory: str = "docs/scale/attention") -> str:
    """The kernel comparison of docs/models.md: one row per committed plan in
    `directory` (`python -m experiments.plan ... --config.model.attention=<kind>
    --nosearch --json=<directory>/<config>_<target>_<kind>.json`), temporaries per device."""
    rows = [
        "| plan | target | model.attention | kernel planned | step temporaries GiB | "
        "log-prob temporaries GiB | sampler temporaries GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for (name, _target, requested), p in committed(directory):
        temp = {k: f"{v['temp_gib']:.2f}" for k, v in p["programs"].items()}
        rows.append(
            f"| {name} | {p['target']} | {requested} | {p['attention']} | {temp['step']} | "
            f"{temp['logprob']} | {temp['generate']} |"
        )
    return "\n".join(rows)


def remat_table(directory: str = "docs/scale/remat") -> str:
    """Remat and its policy, for docs/scale.md: one row per committed plan in `directory`
    (`python -m experiments.plan ... [--config.model.remat=False |
    --config.model.remat_policy=dots] --nosearch --json=<directory>/<config>_<target>_
    <none|full|dots>.json`), the step's GiB per device and the training phase's roofline."""
    rows = [
        "| plan | target | remat | step temporaries GiB | step total of usable GiB | fits | "
        "peak program | training FLOPs per RL step | training roofline s | roofline s / step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    label = {"none": "off", "full": "full", "dots": "dots"}
    for (name, _target, variant), p in committed(directory):
        st = p["programs"]["step"]
        rows.append(
            f"| {name} | {p['target']} | {label[variant]} | {st['temp_gib']:.2f} | "
            f"{st['total_gib']:.2f} of {p['usable_gib']:.2f} | "
            f"{'yes' if st['fits'] else '**no**'} | {p['peak_program']} | "
            f"{p['flops']['train']:.2e} | {p['roofline']['train']:.0f} | {p['est_step_s']:.0f} |"
        )
    return "\n".join(rows)


def sampler_table(directory: str = "docs/scale/sampler") -> str:
    """The sampler's forms and knobs, for docs/scale.md: one row per committed plan in
    `directory` (`python -m experiments.plan ... --config.sampling.<knob>=<value>
    --nosearch --json=<directory>/<config>_<target>_<variant>.json`), GiB per device;
    the decode's roofline seconds per RL step (all its calls)."""
    rows = [
        "| plan | target | sampler | lanes per device | KV cache GiB | gathered weights GiB | "
        "sampler temporaries GiB | sampler total of usable GiB | fits | decode roofline s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, _target, _decode), p in committed(directory):
        g = p["programs"]["generate"]
        if g.get("decode") == "continuous":
            kind, lanes = f"continuous, {g['slots']} slots", str(g["lanes_per_shard"])
        else:
            n = g["decode_phases"]
            kind = f"static, {n} phase{'s' if n > 1 else ''}"
            kind += f", {g['decode_growth']} growth" if n > 1 else ""
            shards = p["mesh"]["data"] * p["mesh"]["fsdp"]  # a call's rows split over these
            lanes = f"{g['rows_per_call'] // shards} rows"
        rows.append(
            f"| {name} | {p['target']} | {kind} | {lanes} | "
            f"{p['per_device']['kv_cache'] / 2**30:.2f} | "
            f"{g.get('gathered_params_bytes', 0) / 2**30:.2f} | {g['temp_gib']:.2f} | "
            f"{g['total_gib']:.2f} of {p['usable_gib']:.2f} | {'yes' if g['fits'] else '**no**'} | "
            f"{p['roofline']['decode']:.0f} |"
        )
    return "\n".join(rows)


def check_table(directory: str = "docs/scale/check") -> str:
    """Plans against measured runs, for docs/scale.md: one row per program of each
    committed `experiments.check_plan --json=<directory>/<run>.json` (its plan is
    the file it names), computed by `gdpo_jax.scale.measure.compare`."""
    from gdpo_jax.scale.measure import compare

    def gib(x):
        return "n/a" if x is None else f"{x / 2**30:.2f}"

    rows = [
        "| run | program | planned GiB | measured peak GiB | measured / planned | "
        "peak compiling GiB | roofline s | measured s | measured / roofline | MFU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        if os.path.basename(path).startswith("plan_"):
            continue
        with open(path) as f:
            run = json.load(f)
        with open(os.path.join(directory, os.path.basename(run["plan_file"]))) as f:
            plan = json.load(f)
        name = os.path.splitext(os.path.basename(path))[0]
        for r in compare(plan, run["measured"]):
            rows.append(
                f"| {name} | {r['program']} | {gib(r['planned_bytes'])} | "
                f"{gib(r['measured_peak_bytes'])} | {r['memory_ratio']:.3f} | "
                f"{gib(r['compile_peak_bytes'])} | {r['roofline_s']:.2f} | "
                f"{r['measured_s']:.2f} | {r['time_ratio']:.2f} | {r['mfu']:.1%} |"
            )
    return "\n".join(rows)
