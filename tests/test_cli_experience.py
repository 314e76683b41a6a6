"""The command line as a new user meets it (issue 14): quiet logs, config.json, plots,
one-line errors (exit 2) before any work, URL workdirs, console scripts from any directory."""

from __future__ import annotations

import ast
import importlib
import json
import logging
import os
import pathlib
import subprocess
import sys

import pytest

from tests._subprocess import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gdpo_jax.train import cli, logs, paths, plots  # noqa: E402
from gdpo_jax.train.config import ConfigError, base_config  # noqa: E402
from gdpo_jax.train.metrics import MetricsWriter, read_jsonl, tb_tag  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# `gdpo-train` as the console script calls it (the package is not pip-installed here).
SCRIPT = {
    "train": "import sys; from experiments.train import run; sys.argv[0] = 'gdpo-train'; run()",
    "compare": (
        "import sys; from experiments.compare_estimators import run; "
        "sys.argv[0] = 'gdpo-compare'; run()"
    ),
}
TINY = [
    "--config=configs/tiny_cpu.py:runlocal",
    "--config.train.progress_bar=False",
    "--config.model.tiny.num_layers=1",
    "--config.model.tiny.hidden_size=64",
    "--config.model.tiny.intermediate_size=128",
    "--config.model.tiny.head_dim=16",
    "--config.mesh.num_devices=1",
]


def _env() -> dict[str, str]:
    return child_env()


def _run(tool: str, args: list[str], cwd: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT[tool], *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ------------------------------------------------------------------ units
def test_tensorboard_tags_are_grouped():
    assert tb_tag("reward/toy_format/mean") == "reward/toy_format/mean"
    assert tb_tag("adv/std") == "adv/std"
    assert tb_tag("loss") == "loss/loss"
    assert tb_tag("kl") == "loss/kl" and tb_tag("clip_frac_low") == "loss/clip_frac_low"
    assert tb_tag("lr") == "optim/lr" and tb_tag("grad_norm") == "optim/grad_norm"
    assert tb_tag("perf/tokens_per_s") == "perf/tokens_per_s"
    assert tb_tag("reward_time/a") == "time/reward/a"
    assert tb_tag("reward_failures/a") == "reward/failures/a"
    assert tb_tag("something") == "misc/something"


def test_every_loss_metric_has_a_tensorboard_group():
    # clip_frac_dual and kl_in_reward were filed under misc/, not with the other loss terms.
    import jax.numpy as jnp

    from gdpo_jax.core.losses import policy_loss

    x = jnp.zeros((2, 3))
    _, _, metrics = policy_loss(
        x, x, jnp.ones(2), jnp.ones((2, 3)), dual_clip=3.0, ref_logp=x, beta=0.1, entropy=x
    )
    assert {"clip_frac_dual", "kl", "entropy", "ratio_max"} <= set(metrics)
    for key in [*metrics, "kl_in_reward"]:  # kl_in_reward: the step's own (step.py)
        assert tb_tag(key) == f"loss/{key}", key


def test_apply_overrides_types_commas_and_one_line_errors():
    c = base_config()
    cli.apply_overrides(
        c,
        [
            ("rewards.weights", "(1.0,2.0)"),  # commas stay inside the value
            ("train.num_steps", "3"),
            ("train.tensorboard", "false"),
            ("optim.lr", "1e-3"),
            ("task.name", "math"),
        ],
    )
    assert c.rewards.weights == (1.0, 2.0) and c.train.num_steps == 3
    assert c.train.tensorboard is False and c.optim.lr == 1e-3 and c.task.name == "math"
    with pytest.raises(ConfigError, match=r'^--config.algo.estimater: no such .*"estimator"'):
        cli.apply_overrides(c, [("algo.estimater", "gdpo")])
    with pytest.raises(ConfigError, match=r"^--sft_config.train.num_steps=abc: expected a int"):
        cli.apply_overrides(c, [("train.num_steps", "abc")], "--sft_config")
    with pytest.raises(ConfigError, match="group of fields"):
        cli.apply_overrides(c, [("train", "3")])
    rest, found = cli.split_overrides(
        ["prog", "--task=math", "--config.a.b=1,2", "--sft_config.x=y"], ("config", "sft_config")
    )
    assert rest == ["prog", "--task=math"]
    assert found == {"config": [("a.b", "1,2")], "sft_config": [("x", "y")]}


def test_url_workdir_without_its_filesystem_package_is_one_clear_error(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.chdir(tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("gcsfs", "tensorflow") else real(name, *a),
    )
    with pytest.raises(ConfigError, match=r"gs://bucket/run.*pip install gcsfs"):
        paths.check_workdir("gs://bucket/run")
    with pytest.raises(ConfigError, match="unsupported URL scheme 'ftp'"):
        paths.check_workdir("ftp://host/run")
    paths.check_workdir("runs/local")  # local: nothing to check
    assert os.listdir(tmp_path) == []  # nothing created, in particular no ./gs:/


def test_model_and_data_paths_checked_before_the_build(tmp_path):
    c = base_config()
    c.model.name = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"config.model.name=.*missing.*hf download"):
        paths.check_inputs(c)
    (tmp_path / "empty").mkdir()
    c.model.name = str(tmp_path / "empty")
    with pytest.raises(ConfigError, match="no config.json"):
        paths.check_inputs(c)
    (tmp_path / "empty" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ConfigError, match=r"holds no \*\.safetensors weights"):
        paths.check_inputs(c)
    (tmp_path / "empty" / "model.safetensors").write_bytes(b"")
    paths.check_inputs(c)
    c.model.name = "smollm2-135m-instruct"  # a known offline name, not a path
    paths.check_inputs(c)
    c.task.source = str(tmp_path / "data" / "*.jsonl")
    with pytest.raises(ConfigError, match=r"config.task.source=.*matches no file"):
        paths.check_inputs(c)
    c.task.source, c.task.eval_source = "synthetic", str(tmp_path / "nope.parquet")
    with pytest.raises(ConfigError, match=r"config.task.eval_source"):
        paths.check_inputs(c)


def test_data_path_checks_take_existing_paths_literally_and_globs_need_data_files(tmp_path):
    # An existing `set[1]/train.jsonl` was taken as a glob (matching "set1/...") and
    # rejected; a glob matching only a README passed here and failed in the loader.
    c = base_config()
    c.model.name = "smollm2-135m-instruct"
    (tmp_path / "set[1]").mkdir()
    (tmp_path / "set[1]" / "train.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "set[1]" / "README.md").write_text("")
    c.task.source = str(tmp_path / "set[1]" / "train.jsonl")
    paths.check_inputs(c)
    c.task.source = str(tmp_path / "set[1]")
    paths.check_inputs(c)
    c.task.source = str(tmp_path / "set?1?" / "*.jsonl")
    paths.check_inputs(c)
    c.task.source = str(tmp_path / "set?1?" / "R*")
    with pytest.raises(ConfigError, match=r"matches no \.jsonl/\.json/\.parquet file.*README\.md"):
        paths.check_inputs(c)


def test_trainer_checks_data_paths_before_building_the_model(tmp_path, monkeypatch):
    # train() / Trainer from Python met a missing task.eval_source only after the model
    # build (the CLI checked paths itself); a run given its records needs no data path.
    from configs.tiny_cpu import get_config
    from gdpo_jax.tasks.registry import TaskData
    from gdpo_jax.train import build
    from gdpo_jax.train.loop import Trainer

    def built(*a, **k):
        raise AssertionError("the model was built")

    monkeypatch.setattr(build, "build_model", built)
    c = get_config()
    c.workdir = str(tmp_path / "run")
    c.task.name, c.task.chat_template = "math", True  # a task that reads files
    c.task.kwargs = type(c.task.kwargs)()  # not the toy task's
    c.task.eval_source = str(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match=r"config\.task\.eval_source=.*matches no file"):
        Trainer(c)
    with pytest.raises(AssertionError, match="the model was built"):
        Trainer(c, task=TaskData(train=[{"prompt": "w3"}], eval=[]))


class _FakeBucket:
    """etils.epath stand-in: gs://<path> lives under a local directory."""

    def __init__(self, root: pathlib.Path):
        self.root = root

    def __call__(self, url: str) -> pathlib.Path:
        assert url.startswith("gs://"), url
        return self.root / url[len("gs://") :]


def test_a_resumed_run_drops_what_a_killed_attempt_logged_past_its_checkpoint(tmp_path):
    """An attempt killed after its last checkpoint (step 2) had logged steps 3-5 and
    half of step 6. Resumed with another num_steps / log_every, nothing overwrote
    them: reports read step 5 as the finished run's last. The resumed writer keeps
    steps <= 2 and TensorBoard purges the rest; a plain writer keeps everything."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(str(tmp_path), progress_bar=False) as w:
        for step in range(1, 6):
            w.write(step, {"loss": float(step)})
    with open(path, "a") as f:
        f.write('{"step": 6, "lo')  # the kill hit in the middle of a write
    assert sorted(read_jsonl(str(path))) == [1, 2, 3, 4, 5]  # the torn line is left out
    with MetricsWriter(str(tmp_path), progress_bar=False, resume_step=2) as w:
        w.write(3, {"loss": 30.0})
    assert read_jsonl(str(path)) == {
        1: {"step": 1, "loss": 1.0},
        2: {"step": 2, "loss": 2.0},
        3: {"step": 3, "loss": 30.0},
    }
    acc = EventAccumulator(str(tmp_path / "tb"))  # both writers' files, same second
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss/loss")] == [(1, 1), (2, 2), (3, 30)]
    with MetricsWriter(str(tmp_path), progress_bar=False, tensorboard=False) as w:
        w.write(9, {"loss": 9.0})  # no resume_step: records are only added
    assert sorted(read_jsonl(str(path))) == [1, 2, 3, 9]
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not a JSON record"):
        read_jsonl(str(path))


def test_url_workdir_gets_metrics_tensorboard_config_and_plots(tmp_path, monkeypatch):
    bucket = tmp_path / "bucket"
    monkeypatch.setattr(paths, "_epath", _FakeBucket(bucket))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    url = "gs://b/run"
    with MetricsWriter(url, progress_bar=False) as w:
        w.write(1, {"reward/a/mean": 0.25, "loss": 1.0})
    with MetricsWriter(url, progress_bar=False) as w:  # a resumed run appends
        w.write(2, {"reward/a/mean": 0.5, "loss": 0.5, "eval/acc": 0.75})
    recs = read_jsonl(f"{url}/metrics.jsonl")
    assert sorted(recs) == [1, 2] and recs[2]["eval/acc"] == 0.75
    assert any(p.name.startswith("events.out.tfevents") for p in (bucket / "b/run/tb").iterdir())
    c = base_config()
    c.workdir = url
    logs.save_config(c)
    assert json.loads((bucket / "b/run/config.json").read_text())["workdir"] == url
    written = plots.plot_run(url)
    assert f"{url}/plots/train_a.png" in written and f"{url}/plots/eval_acc.png" in written
    assert (bucket / "b/run/plots/train_a.png").read_bytes()[:8] == PNG_MAGIC
    assert os.listdir(cwd) == []  # never ./gs:/b/run

    from gdpo_jax.train import checkpoint

    seen = {}
    monkeypatch.setattr(
        checkpoint.ocp, "CheckpointManager", lambda d, **kw: seen.setdefault("dir", d)
    )
    checkpoint.Checkpointer.from_config(c)
    assert seen["dir"] == "gs://b/run/checkpoints"  # handed to Orbax as a URL


def test_logging_quiets_third_party_keeps_project_info():
    logs.setup_logging("info")
    assert logging.getLogger("gdpo_jax.train").isEnabledFor(logging.INFO)
    for name in ("absl", "orbax", "jax", "etils", "some.other.lib"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert logging.getLogger(name).isEnabledFor(logging.WARNING), name
    logs.setup_logging("debug")
    assert logging.getLogger("orbax").isEnabledFor(logging.INFO)
    assert logging.getLogger("gdpo_jax").isEnabledFor(logging.DEBUG)
    logs.setup_logging("info")
    with pytest.raises(ValueError, match="--log_level"):
        logs.setup_logging("loud")


def test_logging_silences_transformers_advice_not_its_warnings(monkeypatch):
    # A torch-free install (`make demo`) printed transformers' "PyTorch was not found"
    # advice in the middle of the run's log. The records are collected by a handler
    # of the test's own: transformers' stderr handler keeps whichever sys.stderr it
    # was created with (an earlier test's capture under xdist), so capfd may miss it.
    from transformers.utils import logging as hf_logging

    class Collect(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    monkeypatch.setenv("TRANSFORMERS_NO_ADVISORY_WARNINGS", "")
    monkeypatch.delenv("TRANSFORMERS_NO_ADVISORY_WARNINGS")
    hf_log = hf_logging.get_logger("transformers.test_probe")
    collect = Collect()
    hf_log.addHandler(collect)
    try:
        logs.setup_logging("info")
        hf_log.warning_advice("advice-line-7f3")
        hf_log.warning("warning-line-7f3")
    finally:
        hf_log.removeHandler(collect)
    assert collect.lines == ["warning-line-7f3"]


def test_plot_run_and_summary_from_metrics(tmp_path):
    recs = [
        {"step": 1, "reward/fmt/mean": 0.1, "reward/total": 0.1, "loss": 1.0},
        {"step": 2, "reward/fmt/mean": 0.3, "reward/total": 0.3, "eval/pass@1": 0.5},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    written = plots.plot_run(str(tmp_path), label="gdpo")
    names = sorted(os.path.basename(p) for p in written)
    assert names == ["eval_passat1.png", "train_fmt.png", "train_total.png"]
    for p in written:
        assert pathlib.Path(p).read_bytes()[:8] == PNG_MAGIC
    lines = logs.summary(str(tmp_path), seconds=12.0, plots=written)
    assert lines[0] == "step 2 in 12 s; training rewards: fmt=0.3, total=0.3"
    assert lines[1] == "held-out at step 2: pass@1=0.5"
    assert f"tensorboard --logdir {tmp_path}/tb" in lines[-1]
    assert plots.plot_run(str(tmp_path / "nothing")) == []


def test_config_paths_resolve_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    resolved = cli.resolve_config_path("configs/tiny_cpu.py:runlocal")
    assert resolved == os.path.join(ROOT, "configs", "tiny_cpu.py") + ":runlocal"
    (tmp_path / "mine.py").write_text("x = 1\n")
    assert cli.resolve_config_path("mine.py") == "mine.py"  # the caller's file first
    with pytest.raises(SystemExit) as e:
        cli.resolve_config_path("configs/nope.py")
    assert e.value.code == 2


def test_console_scripts_resolve_and_viz_extra_listed():
    tree = ast.parse(open(os.path.join(ROOT, "setup.py")).read())
    values = {
        t.id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and t.id in ("CONSOLE_SCRIPTS",)
    }
    scripts = dict(s.split("=") for s in values["CONSOLE_SCRIPTS"])
    assert set(scripts) == {"gdpo-train", "gdpo-sft", "gdpo-compare"}
    for target in scripts.values():
        module, fn = target.split(":")
        assert callable(getattr(importlib.import_module(module), fn)), target
    text = open(os.path.join(ROOT, "setup.py")).read()
    assert '"viz": ["tensorboard==' in text and "nbconvert==" in text
    assert '"configs", "experiments"' in text  # shipped with the package


def _make_dry_run(target: str, tmp_path) -> str:
    """What `make TARGET` would run on a fresh machine (no venv yet), without running it."""
    out = subprocess.run(
        ["make", "-n", target, f"VENV={tmp_path}/venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_demo_installs_lean_and_test_adds_references_and_lint(tmp_path):
    demo = _make_dry_run("demo", tmp_path)
    assert '-e ".[viz]"' in demo and ".[dev]" not in demo  # no torch / TRL for the demo
    assert "experiments.train" in demo
    test = _make_dry_run("test", tmp_path)
    assert '-e ".[dev,aot]"' in test  # references + the planner's compilers
    # lint (ruff check + format check) runs before pytest
    assert test.index("ruff check") < test.index("ruff format --check") < test.index("-m pytest")


def test_replica_configs_log_tensorboard():
    from experiments import compare_estimators as ce

    for task in ("toolcall", "math"):
        cfg = ce.run_config(task, estimator="gdpo", seed=0, workdir="/w", model="m", quick=False)
        assert cfg.train.tensorboard is True, task


def test_small_preset_validates_and_overrides_reach_both_stages(tmp_path):
    from experiments import compare_estimators as ce

    small = ce.SIZES["small"]
    assert small["estimators"] == ("grpo", "gdpo") and small["seeds"] == 2
    model, configs = ce.prepare(
        "toolcall",
        out_dir=str(tmp_path),
        estimators=small["estimators"],
        seeds=range(small["seeds"]),
        quick=False,
        sft_dir="",
        overrides=[*small["rl"], ("rewards.weights", "(1.0,2.0)")],
        sft_overrides=[*small["sft"], ("sft.batch_size", "16")],
        variant="",
    )
    assert sorted(configs) == [("gdpo", 0), ("gdpo", 1), ("grpo", 0), ("grpo", 1)]
    assert all(
        c.train.num_steps == 30 and c.rewards.weights == (1.0, 2.0) for c in configs.values()
    )
    assert model == os.path.join(str(tmp_path), "sft", "hf")
    sft = ce.sft_config("toolcall", str(tmp_path / "sft"), quick=False, overrides=small["sft"])
    assert sft.sft.num_steps == 100
    assert os.listdir(tmp_path) == []  # validation wrote nothing


def _stderr_lines(text: str) -> list[str]:
    """Non-empty stderr lines of a run. The CUDA plugin's no-driver probe lines
    (the `aot` extra, on a machine without a GPU) count too: the CLIs drop them
    at their start (gdpo_jax/quiet_start.py)."""
    return [x for x in text.splitlines() if x.strip()]


# --------------------------------------------------------- as a user runs it
@pytest.mark.parametrize(
    "tool,args,expected",
    [
        ("train", ["--config.algo.estimater=gdpo"], "--config.algo.estimater: no such config"),
        ("train", ["--config.train.num_steps=abc"], "--config.train.num_steps=abc"),
        ("train", ["--config.model.name=no/such/dir"], "config.model.name='no/such/dir'"),
        ("train", ["--config.workdir=ftp://h/run"], "unsupported URL scheme"),
        ("compare", ["--config.train.num_step=3"], "--config.train.num_step: no such config"),
        ("compare", ["--sft_config.sft.num_steps=x"], "--sft_config.sft.num_steps=x: expected"),
        ("compare", ["--set=rewards.weights=(1.0,2.0,3.0)"], "config.rewards.weights has 3"),
    ],
)
def test_every_mistake_is_one_line_exit_2_before_any_work(tmp_path, tool, args, expected):
    wd = tmp_path / "out"
    base = [*TINY, f"--config.workdir={wd}"] if tool == "train" else ["--out_dir", str(wd)]
    if tool == "train" and any(a.startswith("--config.workdir") for a in args):
        base = TINY
    out = _run(tool, [*base, *args], cwd=str(tmp_path), timeout=120)
    lines = _stderr_lines(out.stderr)
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert not wd.exists()  # no work started
    assert os.listdir(tmp_path) == []  # nor anywhere else under the working directory


@pytest.mark.slow
def test_demo_like_run_is_quiet_writes_config_plots_and_resumes_as_finished(tmp_path):
    # From another directory, config path relative to the repository's configs/.
    wd = tmp_path / "run"
    args = [*TINY, f"--config.workdir={wd}", "--config.train.num_steps=2"]
    out = _run("train", args, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = _stderr_lines(out.stderr)
    assert len(lines) < 15, "\n".join(lines)
    assert not [x for x in lines if "orbax" in x or "checkpoint_manager" in x]
    text = "\n".join(lines)
    assert "gdpo on task toy_toolcall" in text and str(wd) in text
    assert f"TensorBoard: tensorboard --logdir {wd}/tb" in text
    assert json.loads((wd / "config.json").read_text())["train"]["num_steps"] == 2
    assert (wd / "plots" / "train_toy_format.png").read_bytes()[:8] == PNG_MAGIC
    assert sorted(read_jsonl(str(wd / "metrics.jsonl"))) == [1, 2]

    again = _run("train", args, cwd=str(tmp_path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already finished" in again.stderr and "step 2" in again.stderr
    assert sorted(read_jsonl(str(wd / "metrics.jsonl"))) == [1, 2]  # nothing trained again


def test_a_preempted_comparison_stops_with_one_line_and_status_143(tmp_path):
    # The run in flight saved its step (the loop's part, tested in test_train_loop); the
    # sweep's CLI printed PreemptedError's traceback and exit status 1.
    script = (
        "import sys; from experiments import compare_estimators as ce; "
        "from gdpo_jax.errors import PreemptedError\n"
        "def preempted(*args, **kwargs):\n"
        "    raise PreemptedError.at_step(7, '/w/checkpoints')\n"
        "ce.run_comparison = preempted; sys.argv[0] = 'gdpo-compare'; ce.run()"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, "--task=toolcall", "--quick", f"--out_dir={tmp_path}/c"],
        cwd=str(tmp_path),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 143, out.stderr[-2000:]
    assert out.stderr.splitlines()[-1] == (
        "stopped: preemption notice (SIGTERM): stopped after step 7 and saved it in "
        "/w/checkpoints; run the same command to resume from step 7."
    )
