r"""The committed table of docs/scale.md: every paper config on the targets a lab would use.

    JAX_PLATFORMS=cpu python -m experiments.plan_table --redo     # all plans (~20 min on 2 cores)
    JAX_PLATFORMS=cpu python -m experiments.plan_table --redo --only=tool-1.5b@8xh100
    JAX_PLATFORMS=cpu python -m experiments.plan_table            # the missing plans, the table
    JAX_PLATFORMS=cpu python -m experiments.plan_table --remat_policy=dots   # the remat sweep

Plans each (config, target) pair with gdpo_jax.scale.plan.make_plan (and, for a
plan that does not fit, the change the planner's search finds) and writes
every plan to docs/scale/plans.json as soon as it is made, each with the
equivalent `experiments.plan` command line (`command`). A long run can be
stopped and resumed: finished entries are kept unless --redo. It rewrites
the table between the `<!-- plan-table -->` markers of docs/scale.md.
`algo.num_microbatches` is scaled from the configs' 8-device value to the
target's device count (same rows per device per micro-batch), as the
configs' docstrings tell a user to do. `--remat_policy` plans every entry again with
that `model.remat_policy`, each into docs/scale/remat_sweep/ (resumable the same way),
and rewrites scale.md's sweep table, each entry beside its plans.json plan.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

from absl import app, flags  # noqa: E402

from experiments.scale_tables import committed  # noqa: E402

TABLE_START, TABLE_END = "<!-- plan-table -->", "<!-- /plan-table -->"
SWEEP_START, SWEEP_END = "<!-- remat-sweep-table -->", "<!-- /remat-sweep-table -->"
SWEEP_DIR = "remat_sweep"  # under --out: one plan per entry and policy, <pid>_<target>_<policy>

_ONLY = flags.DEFINE_list(
    "only", [], "Plan ids to make (with --redo: remake), e.g. tool-1.5b@8xh100."
)
_REDO = flags.DEFINE_bool(
    "redo", False, "Re-plan entries already in plans.json (with --remat_policy: in the sweep)."
)
_OUT = flags.DEFINE_string("out", "docs/scale", "Directory of plans.json (and scale.md beside).")
_REMAT_POLICY = flags.DEFINE_enum(
    "remat_policy",
    None,
    ["full", "dots"],
    "Plan every entry with this model.remat_policy instead of the config's own, each to "
    f"<out>/{SWEEP_DIR}/<entry>_<policy>.json, and rewrite scale.md's remat sweep table "
    "(each entry beside its plans.json plan). plans.json and the plan table stay as they are.",
)
_RECOUNT = flags.DEFINE_bool(
    "recount",
    False,
    "Recount the analytic fields (FLOPs, roofline, est_step_s) of every committed plan "
    "(plans.json and <out>/*/*.json) from its step shape with today's formulas, no compile; "
    "for a change to gdpo_jax/scale/flops.py. Prints the plans that changed.",
)

# (id, config file, config arg, what the paper / official verl recipe ran it on, targets)
PAPER = (
    (
        "tool-1.5b",
        "configs/paper_toolcall.py",
        "qwen2.5-1.5b",
        "8 GPUs, one node (verl)",
        ("8xh100", "8xa100-80g", "v5p-8", "v5e-16"),
    ),
    (
        "tool-3b",
        "configs/paper_toolcall.py",
        "qwen2.5-3b",
        "8 GPUs, one node (verl)",
        ("8xh100", "v5p-16"),
    ),
    (
        "math-r1-1.5b",
        "configs/paper_math.py",
        "r1-distill-1.5b",
        "8 GPUs, one node (verl)",
        ("8xh100", "v5p-16"),
    ),
    (
        "math-r1-7b",
        "configs/paper_math.py",
        "r1-distill-7b",
        "8 GPUs, one node (verl)",
        ("8xh100", "v5p-32"),
    ),
    (
        "math-qwen3-4b",
        "configs/paper_math.py",
        "qwen3-4b",
        "8 GPUs, one node (verl)",
        ("8xh100", "v5p-8", "v5p-16"),
    ),
    (
        "code-r1-7b",
        "configs/paper_code.py",
        "r1-distill-7b",
        "8 GPUs, one node (verl)",
        ("8xh100",),
    ),
)


def load_config(path: str, arg: str):
    spec = importlib.util.spec_from_file_location("cfg_" + os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(arg)


def scaled(cfg, num_devices: int):
    """The config with num_microbatches scaled from 8 devices to `num_devices`."""
    with cfg.unlocked():
        cfg.algo.num_microbatches = max(1, cfg.algo.num_microbatches * 8 // num_devices)
    return cfg


def render(plans: dict) -> str:
    head = (
        "| config | target | paper / verl ran on | fits | peak GiB / device | binding "
        "program | step | generate | logprob | roofline s / step | overrides used | "
        "plan time |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for pid, name, arg, ran, targets in PAPER:
        for t in targets:
            p = plans.get(f"{pid}@{t}")
            if p is None:
                rows.append(
                    f"| {name.split('/')[-1]}:{arg} | {t} | {ran} | not planned yet "
                    "| | | | | | | | |"
                )
                continue
            g = {
                k: f"{v['total_gib']:.1f}" + ("" if v["fits"] else " (no)")
                for k, v in p["programs"].items()
            }
            ov = " ".join(p.get("overrides", [])) or "-"
            sug = p.get("suggestion")
            fits = (
                "yes"
                if p["fits"]
                else "**no**"
                + (
                    f"; fits with `{' '.join(sug['overrides'])}` ({sug['peak_gib']:.1f} GiB, "
                    f"roofline {sug['est_step_s']:.0f} s)"
                    if sug
                    else ""
                )
            )
            rows.append(
                f"| {name.split('/')[-1]}:{arg} | {t} | {ran} | {fits} | {p['peak_gib']:.1f} of "
                f"{p['usable_gib']:.0f} | {p['peak_program']} | {g.get('step', '-')} | "
                f"{g.get('generate', '-')} | {g.get('logprob', '-')} | {p['est_step_s']:.0f} | "
                f"`{ov}` | {p['plan_s'] / 60:.1f} min |"
            )
    return "\n".join(rows)


def _secs(x: float) -> str:
    """Seconds as the sweep table shows them: tenths below 100 s (tool calling's steps)."""
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def remat_sweep_table(directory: str, plans: dict) -> str:
    """The remat sweep, for docs/scale.md: each plan of `directory` (`plan_table
    --remat_policy=<p>`: <pid>_<target>_<p>.json) beside the plan table's plan of the same
    entry (`plans`, plans.json's), in the table's order: the step's GiB per device, the
    peak program, whether it fits, and the training phase's and the RL step's rooflines."""
    swept: dict[tuple[str, str], list[dict]] = {}
    for (pid, target, _policy), p in committed(directory):  # in name order: by policy
        swept.setdefault((pid, target), []).append(p)
    rows = [
        "| config | target | remat policy | step GiB / device | peak GiB / device (program) "
        "| fits | training roofline s | roofline s / RL step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for pid, name, arg, _ran, targets in PAPER:
        for t in targets:
            if (pid, t) not in swept or f"{pid}@{t}" not in plans:
                continue
            for p in (plans[f"{pid}@{t}"], *swept[(pid, t)]):
                st = p["programs"]["step"]
                fits = "yes" if p["fits"] else "**no**"
                if not p["fits"] and p.get("suggestion"):
                    fits += f"; fits with `{' '.join(p['suggestion']['overrides'])}`"
                rows.append(
                    f"| {name.split('/')[-1]}:{arg} | {t} | "
                    f"{p['step_shape'].get('remat_policy', 'full')} | {st['total_gib']:.1f} | "
                    f"{p['peak_gib']:.1f} of {p['usable_gib']:.0f} ({p['peak_program']}) | "
                    f"{fits} | {_secs(p['roofline']['train'])} | {_secs(p['est_step_s'])} |"
                )
    return "\n".join(rows)


def write_doc(plans: dict, md_path: str) -> None:
    table = render(plans)
    total = sum(p["plan_s"] for p in plans.values())
    kinds = sorted({p.get("planned_on", "an unrecorded machine") for p in plans.values()})
    table += (
        f"\n\n{len(plans)} plans, {total / 60:.0f} min of planning in all on "
        f"{', '.join(kinds)} (`python -m experiments.plan_table`; the machine kind as "
        "`benchmarks.run_all` names it)."
    )
    write_between(md_path, TABLE_START, TABLE_END, table)


def write_between(md_path: str, start: str, end: str, table: str) -> None:
    """Replaces what stands between the markers `start` and `end` of `md_path` with
    `table` (the markers are appended to a page that lacks them)."""
    text = open(md_path).read() if os.path.exists(md_path) else ""
    if start not in text:
        text += f"\n{start}\n{end}\n"
    pre, rest = text.split(start, 1)
    post = rest.split(end, 1)[1]
    with open(md_path, "w") as f:
        f.write(f"{pre}{start}\n{table}\n{end}{post}")


def rederive(plan: dict) -> dict:
    """Fills a refused program's bytes from its stored compiler message (older entries)."""
    from gdpo_jax.scale.memory import oom_bytes
    from gdpo_jax.scale.targets import GIB

    progs = plan["programs"]
    for p in progs.values():
        if not p["compiled"] and not p["temps"]:
            used = oom_bytes(p.get("error") or "")
            p["temps"] = p["program_bytes"] = used
            p["total_bytes"] = used + p["resident_bytes"]
            p["total_gib"], p["temp_gib"] = p["total_bytes"] / GIB, used / GIB
    peak = max(progs, key=lambda k: (not progs[k]["compiled"], progs[k]["total_bytes"]))
    plan["peak_program"], plan["peak_gib"] = peak, progs[peak]["total_bytes"] / GIB
    return plan


def recount(plan: dict) -> dict:
    """`plan` with its FLOPs, roofline and est_step_s counted again from its step shape
    (gdpo_jax.scale.flops, the target's chip); the compiled memory is left as it is.
    A continuous-batching plan made before `StepShape.decode_lanes` gets its lanes."""
    import dataclasses

    import ml_collections as mlc

    from gdpo_jax.scale import arch
    from gdpo_jax.scale import flops as flops_lib
    from gdpo_jax.scale.targets import parse_target

    shape = dict(plan["step_shape"], decode_chunks=tuple(plan["step_shape"]["decode_chunks"]))
    gen = plan["programs"].get("generate", {})
    if gen.get("decode") == "continuous":
        shape.setdefault("decode_lanes", gen["lanes_per_shard"])
    step_shape = flops_lib.StepShape(**shape)
    cfg = mlc.ConfigDict(
        {"model": {"name": plan["model"], "dtype": "bfloat16", "param_dtype": "float32"}}
    )
    cfg.model.remat = True  # FLOPs and bytes do not depend on the dtypes named here
    mc, chip = arch.model_config(cfg), parse_target(plan["target"]).chip
    fl = flops_lib.step_flops(mc, step_shape)
    roof = flops_lib.roofline(
        mc,
        step_shape,
        num_devices=plan["num_devices"],
        peak_flops=chip.peak_flops,
        hbm_bw=chip.hbm_bw,
    )
    return dict(
        plan,
        step_shape=dataclasses.asdict(step_shape),
        flops=fl,
        step_flops=fl["total"],
        roofline=roof,
        est_step_s=roof["total"],
    )


def _recount_all(directory: str) -> None:
    """Writes back every committed plan whose recount differs; prints each."""

    def same(a: dict, b: dict) -> bool:
        return json.dumps(a, sort_keys=True, default=str) == json.dumps(
            b, sort_keys=True, default=str
        )

    path = os.path.join(directory, "plans.json")
    with open(path) as f:
        table = json.load(f)
    new = {k: recount(v) if "step_shape" in v else v for k, v in table.items()}
    if not same(new, table):
        with open(path, "w") as f:
            json.dump(new, f, indent=1, default=str)
        print(f"recounted {[k for k in new if not same(new[k], table[k])]} in {path}")
    for p in sorted(glob.glob(os.path.join(directory, "*", "*.json"))):
        with open(p) as f:
            plan = json.load(f)
        if "step_shape" not in plan:  # a measured run, or a plan older than step_shape
            continue
        again = recount(plan)
        if not same(again, plan):
            with open(p, "w") as f:
                json.dump(again, f, indent=1, default=str)
            print(
                f"recounted {p}: est_step_s {plan['est_step_s']:.2f} -> {again['est_step_s']:.2f}"
            )


def main(argv: list[str]) -> None:
    from gdpo_jax.train import cli

    if len(argv) > 1:  # e.g. an entry without --only=: it would plan every entry
        cli.fail(f"unexpected arguments: {argv[1:]} (entries go in --only=pid@topology,...)")
    known = {f"{pid}@{t}" for pid, _, _, _, targets in PAPER for t in targets}
    unknown = [k for k in _ONLY.value or () if k not in known]
    if unknown:  # it would rewrite scale.md with nothing planned
        cli.fail(f"--only: no entry {unknown}; entries: {', '.join(sorted(known))}.")
    if _RECOUNT.value and _REMAT_POLICY.value:  # the recount would ignore the policy
        cli.fail("--recount recounts every committed plan, the sweep's too: drop --remat_policy.")
    md = os.path.join(os.path.dirname(_OUT.value.rstrip("/")) or ".", "scale.md")
    if _RECOUNT.value:
        if not os.path.isfile(os.path.join(_OUT.value, "plans.json")):  # was a traceback
            cli.fail(f"--recount: --out={_OUT.value} holds no plans.json to recount.")
        _recount_all(_OUT.value)
        # The table renders the recounted roofline (it went stale when only the JSON moved).
        with open(os.path.join(_OUT.value, "plans.json")) as f:
            plans = {k: rederive(v) for k, v in json.load(f).items()}
        write_doc(plans, md)
        swept = os.path.join(_OUT.value, SWEEP_DIR)
        if os.path.isdir(swept):  # its table quotes the recounted rooflines too
            write_between(md, SWEEP_START, SWEEP_END, remat_sweep_table(swept, plans))
        return
    from benchmarks.common import machine_info, machine_kind

    kind = machine_kind(machine_info())  # the plan times' machine
    os.makedirs(_OUT.value, exist_ok=True)
    path = os.path.join(_OUT.value, "plans.json")
    plans = json.load(open(path)) if os.path.exists(path) else {}
    plans = {k: rederive(v) for k, v in plans.items()}
    policy = _REMAT_POLICY.value
    if policy:
        _sweep(policy, plans, kind, md)
        return
    for pid, name, arg, _ran, targets in PAPER:
        for t in targets:
            key = f"{pid}@{t}"
            if (_ONLY.value and key not in _ONLY.value) or (key in plans and not _REDO.value):
                continue
            plan = _plan_entry(key, name, arg, t, [], kind)
            if plan is None:
                continue
            plans[key] = plan
            with open(path, "w") as f:
                json.dump(plans, f, indent=1, default=str)
            write_doc(plans, md)
    write_doc(plans, md)


def _plan_entry(key: str, name: str, arg: str, t: str, extra: list[str], kind: str) -> dict | None:
    """The plan of entry `key` (config file `name`, its argument `arg`, topology `t`) with
    the `--config.x=v` flags `extra` on top, stamped with its command line; None (and the
    error printed) when planning fails, so that a long table goes on."""
    from experiments.plan_command import parse_plan_command, table_command
    from gdpo_jax.scale.plan import make_plan
    from gdpo_jax.scale.search import find_fit
    from gdpo_jax.scale.targets import parse_target

    target = parse_target(t)
    cfg = scaled(load_config(name, arg), target.num_devices)
    overrides = [f"--config.algo.num_microbatches={cfg.algo.num_microbatches}", *extra]
    if extra:  # the config the recorded command builds, so the two cannot differ
        cfg = parse_plan_command(table_command(name, arg, t, overrides))[0]
    t0 = time.perf_counter()
    print(f"planning {key} ...", flush=True)
    try:
        plan = make_plan(cfg, target)
        if not plan["fits"]:  # the table names the change that fits (search.py)
            plan["suggestion"] = find_fit(cfg, target, plan)
    except Exception as e:  # noqa: BLE001 - printed; the table shows it unplanned, the run goes on
        print(f"  failed: {e}", file=sys.stderr, flush=True)
        return None
    plan["overrides"], plan["plan_s"] = overrides, time.perf_counter() - t0
    plan["planned_on"] = kind
    plan["command"] = table_command(name, arg, t, overrides)  # the same plan, one CLI call
    print(
        f"  {key}: fits={plan['fits']} peak {plan['peak_gib']:.1f} GiB "
        f"({plan['peak_program']}) in {plan['plan_s']:.0f} s",
        flush=True,
    )
    return plan


def _sweep(policy: str, plans: dict, kind: str, md: str) -> None:
    """Plans every entry (or --only's) with model.remat_policy=`policy` into
    <out>/remat_sweep/<pid>_<target>_<policy>.json, each file as soon as it is made (a
    stopped sweep resumes), then rewrites scale.md's sweep table beside `plans`."""
    directory = os.path.join(_OUT.value, SWEEP_DIR)
    os.makedirs(directory, exist_ok=True)
    for pid, name, arg, _ran, targets in PAPER:
        for t in targets:
            key, out = f"{pid}@{t}", os.path.join(directory, f"{pid}_{t}_{policy}.json")
            if (_ONLY.value and key not in _ONLY.value) or (
                os.path.exists(out) and not _REDO.value
            ):
                continue
            plan = _plan_entry(key, name, arg, t, [f"--config.model.remat_policy={policy}"], kind)
            if plan is None:
                continue
            plan["command"] += f" --json={out}"  # experiments.plan writes the same file
            with open(out, "w") as f:
                json.dump(plan, f, indent=1, default=str)
    write_between(md, SWEEP_START, SWEEP_END, remat_sweep_table(directory, plans))


if __name__ == "__main__":
    from gdpo_jax.train import cli as _cli

    # One-line errors (exit 2) for bad flags too, as every other tool.
    app.run(main, flags_parser=_cli.flags_parser(()))
