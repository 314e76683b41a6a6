"""`experiments.plan_table --remat_policy=<p>`: every entry planned again with that remat
policy, one file each, resumable, and scale.md's sweep table written beside the plan
table's plans. The planner itself is stubbed (its own tests compile real plans): this
checks what the sweep hands it and what it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from absl import flags

ROOT = Path(__file__).resolve().parent.parent
ENTRY = "code-r1-7b@8xh100"


@pytest.fixture
def plan_table(monkeypatch: pytest.MonkeyPatch):
    # plan_table sets these with setdefault on import; keep them out of this process's env.
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")
    from experiments import plan_table

    yield plan_table
    flags.FLAGS.unparse_flags()  # the next test parses its own


def _run(plan_table, out: Path, *args: str) -> None:
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["plan_table", f"--out={out}", *args])
    plan_table.main(["plan_table"])


def test_sweep_plans_each_entry_with_the_policy_once(plan_table, monkeypatch, tmp_path):
    from experiments.plan_command import parse_plan_command
    from gdpo_jax.scale import plan as plan_lib

    committed = json.loads((ROOT / "docs/scale/plans.json").read_text())[ENTRY]
    (tmp_path / "scale").mkdir()
    (tmp_path / "scale" / "plans.json").write_text(json.dumps({ENTRY: committed}))
    marks = f"{plan_table.SWEEP_START}\nold\n{plan_table.SWEEP_END}"
    (tmp_path / "scale.md").write_text(f"before\n{marks}\nafter\n")
    seen = []

    def fake_plan(cfg, target):  # the committed plan, marked with what it was asked
        seen.append((cfg.model.remat_policy, cfg.algo.num_microbatches, target.num_devices))
        step_shape = dict(committed["step_shape"], remat_policy=cfg.model.remat_policy)
        return dict(committed, step_shape=step_shape, est_step_s=1234.0)

    # gdpo_jax.scale.search binds make_plan by name when first imported (plan_table
    # imports it inside main): imported under the patch, it kept the stub for the rest of
    # the process, and a later find_fit in the same xdist worker "fitted" with it
    # (tests/test_scale_plan.py's oversized-sampler test, twice on clean clones). Import
    # it first and patch its name too, so both are restored.
    from gdpo_jax.scale import search as search_lib

    monkeypatch.setattr(plan_lib, "make_plan", fake_plan)
    monkeypatch.setattr(search_lib, "make_plan", fake_plan)
    _run(plan_table, tmp_path / "scale", "--remat_policy=dots", f"--only={ENTRY}")
    assert committed["overrides"] == ["--config.algo.num_microbatches=128"]
    assert seen == [("dots", 128, 8)], seen  # the plan table's micro-batches, and the policy

    path = tmp_path / "scale" / plan_table.SWEEP_DIR / "code-r1-7b_8xh100_dots.json"
    swept = json.loads(path.read_text())
    assert swept["step_shape"]["remat_policy"] == "dots" and swept["est_step_s"] == 1234.0
    assert swept["command"].endswith(f"--json={path}")
    cfg, topology = parse_plan_command(swept["command"])  # the command plans that config
    assert topology == "8xh100" and cfg.model.remat_policy == "dots"
    assert json.loads((tmp_path / "scale" / "plans.json").read_text()) == {ENTRY: committed}

    doc = (tmp_path / "scale.md").read_text()
    table = plan_table.remat_sweep_table(str(path.parent), {ENTRY: committed})
    assert f"{plan_table.SWEEP_START}\n{table}\n{plan_table.SWEEP_END}" in doc
    assert "| full |" in table and "| dots |" in table and "| 1234 |" in table
    assert doc.startswith("before\n") and doc.endswith("after\n") and "old" not in doc

    _run(plan_table, tmp_path / "scale", "--remat_policy=dots", f"--only={ENTRY}")  # resumes
    assert len(seen) == 1
    _run(plan_table, tmp_path / "scale", "--remat_policy=dots", f"--only={ENTRY}", "--redo")
    assert len(seen) == 2
    # Nothing of the stub outlives the test: every name of make_plan is the real one again.
    monkeypatch.undo()
    assert search_lib.make_plan is plan_lib.make_plan and plan_lib.make_plan is not fake_plan
