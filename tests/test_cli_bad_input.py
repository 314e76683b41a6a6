"""The command-line tools besides the trainer refuse bad input in one line (exit 2)
before any work: an output path that cannot be written (checked before a plan
compiles, a benchmark runs or a comparison trains), a count below its minimum, a
file that is not a plan or a plan for another platform, an unknown config option,
a flag another one would silently override, a stray argument. Each of these ran
first and failed after the work, most with a traceback, or printed the whole --help
(the trainer's own: test_config.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests._subprocess import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(module: str, *args: str, cwd: str = ROOT) -> subprocess.CompletedProcess:
    """`python -m module args` (or `python script args` for a path ending in .py)."""
    env = child_env(GDPO_JAX_NO_RELAUNCH="1")
    head = [module] if module.endswith(".py") else ["-m", module]
    return subprocess.run(
        [sys.executable, *head, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_line_error(out: subprocess.CompletedProcess, text: str) -> None:
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert "error: " in last and text in last, last  # argparse's: "<prog>: error: ..."


_TINY = ("--config=configs/tiny_cpu.py", "--config.workdir={tmp}/w")


@pytest.fixture
def afile(tmp_path):
    path = tmp_path / "afile"
    path.write_text("")
    return path


@pytest.fixture
def cuda_plan(tmp_path):
    """A plan's JSON for one H100: another platform than this CPU."""
    path = tmp_path / "plan.json"
    plan = dict(
        target="1xh100",
        platform="cuda",
        device="1 x NVIDIA H100",
        num_devices=1,
        mesh={"data": 1, "fsdp": 1, "tensor": 1},
        programs={"step": {}},
    )
    path.write_text(json.dumps(plan))
    return path


def test_every_benchmark_checks_its_out_flag_before_it_runs():
    # Most benchmarks wrote --out only after the whole run (a FileExistsError at the end).
    import glob

    for path in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))):
        src = open(path).read()
        if '"--out"' in src and "parse_args(" in src:
            assert "check_out(" in src, f"{path}: --out is not checked before the run"


@pytest.mark.parametrize(
    "module,args,text",
    [
        (
            "experiments.plan",
            ("--config=configs/tiny_cpu.py", "--topology=8xh100", "--json={afile}/p.json"),
            "/afile' is a file, so nothing can be written under it",
        ),
        (
            "experiments.plan",
            ("--config=configs/tiny_cpu.py", "--topology=8xh100", "--max_tries=-5"),
            "--max_tries=-5 must be >= 1",
        ),
        (
            "experiments.check_plan",
            ("--config=configs/tiny_cpu.py", "--plan={afile}"),
            "not a readable JSON file",
        ),
        (
            "experiments.tune_microbatches",
            ("--config=configs/tiny_cpu.py", "--steps=0"),
            "--steps=0 must be >= 1",
        ),
        # These four raised absl's UsageError: the whole --help, then the message, exit 1.
        (
            "experiments.tune_microbatches",
            ("--config=configs/tiny_cpu.py", "--counts=2,0"),
            "--counts=2,0: counts must be >= 1",
        ),
        ("experiments.plan", ("--topology=8xh100",), "--config=configs/<name>.py is required"),
        (  # it printed the targets' list without saying what was wrong
            "experiments.plan",
            ("--config=configs/tiny_cpu.py",),
            "--topology is required; known targets: v4-8",
        ),
        (
            "experiments.check_plan",
            ("--config=configs/tiny_cpu.py", "stray"),
            "unexpected arguments",
        ),
        ("experiments.advantage_groups", ("stray",), "unexpected arguments: ['stray']"),
        (  # a plan of another platform: refused in the child, after its compile log was written
            "experiments.check_plan",
            ("--config=configs/tiny_cpu.py", "--plan={plan}", "--json={tmp}/c.json"),
            "the plan is for 1xh100 (cuda) but this machine runs cpu",
        ),
        (
            "experiments.tune_microbatches",
            ("--config=configs/tiny_cpu.py", "--json={afile}/t.json"),
            "--json=",
        ),
        ("experiments.advantage_groups", ("--max_g=1",), "--max_g=1 must be >= 2"),
        (
            "experiments.advantage_groups",
            ("--out_dir={afile}",),
            "is a file, not a directory",
        ),
        (
            "experiments.compare_estimators",
            ("--size=quick", "--seeds=0", "--out_dir={tmp}/cmp"),
            "--seeds=0 must be >= 1",
        ),
        (
            "experiments.compare_estimators",
            ("--size=quick", "--out_dir={afile}", "--sft_dir={tmp}/sft"),
            "--out_dir=",
        ),
        (  # --task was ignored (the study names the task); --window=0 stops the old code early
            "experiments.compare_estimators",
            ("--study=three_binary", "--task=math", "--window=0", "--out_dir={tmp}/cmp"),
            "--task=math: a --study names its own task",
        ),
        (  # --size was ignored (--quick won)
            "experiments.compare_estimators",
            ("--quick", "--size=small", "--window=0", "--out_dir={tmp}/cmp"),
            "--quick is --size=quick",
        ),
        (  # an existing directory without runs: it wrote an empty table and plots there
            "experiments.compare_estimators",
            ("--size=quick", "--report_only", "--out_dir={tmp}"),
            "holds no finished runs of these estimators and seeds",
        ),
        (  # --size=small was ignored (the study's own 3 x 10 seeds ran)
            "experiments.compare_estimators",
            ("--study=three_binary", "--size=small", "--window=0", "--out_dir={tmp}/cmp"),
            "--size=small: a --study runs at its own size",
        ),
        (
            "experiments.sft",
            ("--config=configs/sft_toolcall.py:runlocal", "--config.workdir={afile}"),
            "config.workdir=",
        ),
        (
            "experiments.sft",
            (
                "--config=configs/sft_toolcall.py:runlocal",
                "--config.workdir={tmp}/s",
                "--config.optim.schedule=bogus",
            ),
            "config.optim.schedule='bogus' is not one of",
        ),  # fmt: skip
        (
            "experiments.smollm2_demo",
            ("--config_arg=runlcal", "--workdir={tmp}/d", "--out_dir={tmp}/o"),
            "unknown option 'runlcal'",
        ),
        (  # it rewrote scale.md with the entry "not planned yet"
            "experiments.plan_table",
            ("--only=tool-1.5b@9xh100", "--out={tmp}/pt"),
            "--only: no entry ['tool-1.5b@9xh100']",
        ),
        (
            "benchmarks.bench_advantages",
            ("--quick", "--out={afile}/x.json"),
            "is a file, so nothing can be written under it",
        ),
        # Both failed after the benchmark's model was built (ZeroDivisionError; the Sampler's).
        ("benchmarks.bench_prompt_slots", ("--group=0",), "--group=0 must be >= 1"),
        (
            "benchmarks.bench_prompt_slots",
            ("--prompt-slots", "4", "-3"),
            "--prompt-slots -3: each W must be >= 1",
        ),
        (  # written after the benchmark had run
            "benchmarks.bench_prompt_slots",
            ("--out={afile}/x.json",),
            "is a file, so nothing can be written under it",
        ),
        (  # these ran the whole benchmark, then failed to write (FileExistsError)
            "benchmarks.bench_longtail",
            ("--quick", "--out={afile}/x.json"),
            "is a file, so nothing can be written under it",
        ),
        (
            "benchmarks.bench_sampler",
            ("--quick", "--out={afile}/x.json"),
            "is a file, so nothing can be written under it",
        ),
        ("benchmarks.bench_longtail", ("--quick", "--median=-5"), "--median=-5.0 must be > 0"),
        # Accepted without a word: one stop string "a,b"; a group of one size.
        (
            "experiments.train",
            _TINY + ("--config.sampling.stop_strings=a,b",),
            "is read as one string 'a,b'",
        ),
        (
            "experiments.train",
            _TINY + ("--config.model.tiny={{'num_layers': 2}}",),  # format()'s braces
            "a dict replaces the whole group",
        ),
        (  # ran as RL, its sft section unread
            "experiments.train",
            ("--config=configs/sft_toolcall.py:runlocal", "--config.workdir={tmp}/w"),
            "it is an SFT warm-start config",
        ),
        (  # AttributeError 'sft', a traceback
            "experiments.sft",
            ("--config=configs/tiny_cpu.py", "--config.workdir={tmp}/s"),
            "no 'sft' section: it is an RL config",
        ),
        (  # trained sft.num_steps steps without a word
            "experiments.sft",
            (
                "--config=configs/sft_toolcall.py:runlocal",
                "--config.workdir={tmp}/s",
                "--config.train.num_steps=1",
            ),
            "set config.sft.num_steps instead",
        ),
        (  # planned every device, where the run uses one
            "experiments.plan",
            (
                "--config=configs/tiny_cpu.py",
                "--topology=cuda:1x1x2:h100",
                "--config.mesh.num_devices=1",
                "--nosearch",
                "--json={tmp}/p.json",
            ),
            "a plan covers all 2 devices of the target",
        ),
        (  # FileNotFoundError traceback
            "experiments.plan_table",
            ("--recount", "--out={tmp}/none"),
            "holds no plans.json to recount",
        ),
        (
            "experiments.plan_table",
            ("--remat_policy=dot", "--out={tmp}/pt"),
            "--remat_policy",
        ),
        (
            "experiments.plan_table",
            ("--recount", "--remat_policy=dots", "--out={tmp}/pt"),
            "drop --remat_policy",
        ),
    ],
)
def test_tools_refuse_bad_input_before_any_work(module, args, text, afile, cuda_plan, tmp_path):
    args = tuple(a.format(afile=afile, tmp=tmp_path, plan=cuda_plan) for a in args)
    before = sorted(os.listdir(tmp_path))
    out = _run(module, *args)
    _one_line_error(out, text)
    assert sorted(os.listdir(tmp_path)) == before  # nothing written


def test_smollm2_demo_summary_only_refuses_a_workdir_without_the_demos_files(tmp_path):
    # A plain train workdir (metrics.jsonl alone) got past the check, then stopped on a
    # FileNotFoundError traceback (eval_step0.json).
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "metrics.jsonl").write_text('{"step": 1}\n')
    out = _run(
        "experiments.smollm2_demo",
        "--summary_only",
        f"--workdir={tmp_path / 'w'}",
        f"--out_dir={tmp_path / 'o'}",
    )
    _one_line_error(out, "holds no finished smollm2_demo run (missing eval_step0.json")


def test_the_config_flag_with_a_space_finds_the_installed_configs(tmp_path):
    # `--config configs/x.py` (absl's space form) skipped the fallback to the project's
    # configs that `--config=configs/x.py` has, from any other directory.
    for form in (["--config=configs/tiny_cpu.py"], ["--config", "configs/tiny_cpu.py"]):
        out = _run("experiments.train", *form, "--config.train.num_steps=0", cwd=str(tmp_path))
        _one_line_error(out, "config.workdir is empty")  # loaded: validation ran


def test_every_config_tool_applies_its_log_level(tmp_path):
    # tune_microbatches and check_plan defined --log_level and never applied it: their
    # INFO lines printed at --log_level=error. The level is now set for every main.
    script = tmp_path / "tool.py"
    script.write_text(
        "import logging\nfrom gdpo_jax.train import cli\n\n"
        "def main(argv):\n    logging.getLogger('gdpo_jax.tool').info('an info line')\n"
        "    logging.getLogger('gdpo_jax.tool').error('an error line')\n\n"
        "cli.run_config_main(main)\n"
    )
    for level, info in (("error", False), ("info", True)):
        out = _run(str(script), "--config=configs/tiny_cpu.py", f"--log_level={level}")
        assert out.returncode == 0, out.stderr[-2000:]
        assert "an error line" in out.stderr
        assert ("an info line" in out.stderr) is info, out.stderr[-2000:]


def test_every_experiment_module_imports_into_one_process():
    # tune_microbatches and check_plan both defined --steps and --json at import: the
    # second import raised DuplicateFlagError (a notebook or test importing both).
    import glob

    names = sorted(
        os.path.basename(p)[:-3]
        for p in glob.glob(os.path.join(ROOT, "experiments", "*.py"))
        if not p.endswith("__init__.py")
    )
    code = "import importlib\n" + "".join(
        f"importlib.import_module('experiments.{n}')\n" for n in names
    )
    env = child_env(GDPO_JAX_NO_RELAUNCH="1")
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {"check_plan", "tune_microbatches", "train", "sft"} <= set(names)
