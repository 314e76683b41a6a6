"""The notebooks run top to bottom (small settings) and are committed clean.

Each notebook is executed with nbclient on a kernel spec written at test time
that points at this interpreter (``sys.executable``), so a user-level
``python3`` kernel spec from another Python cannot be picked up by accident.
The notebooks read ``GDPO_NB_FULL`` (unset / "0" = the small settings CI uses).

    pytest tests/test_notebooks.py -q              # all notebooks (slow)
    pytest tests/test_notebooks.py -q -m "not slow"  # the static and in-process checks
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
KERNEL = "gdpo-jax-notebook-test"
CELL_TIMEOUT_S = 300


def _ids(paths: list[pathlib.Path]) -> list[str]:
    return [p.stem for p in paths]


def test_notebooks_exist():
    names = {p.stem for p in NOTEBOOKS}
    assert {"01_quickstart", "02_reward_collapse"} <= names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_clean(path: pathlib.Path):
    """Committed without outputs, with a parameters cell whose default is the small setting."""
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for i, c in enumerate(code):
        assert not c.get("outputs") and c.get("execution_count") is None, (
            f"{path.name}: code cell {i} has outputs; clear them before committing."
        )
    params = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, f"{path.name}: needs exactly one cell tagged 'parameters'."
    src = "".join(params[0]["source"])
    assert "GDPO_NB_FULL" in src and re.search(r"SMALL\s*=", src), (
        f"{path.name}: the parameters cell must set SMALL from GDPO_NB_FULL."
    )
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    # papermill injects its parameters in a cell after this one: a later cell that reads SMALL
    # would see the injected value while the sizes above were computed from the default.
    later = [
        i
        for i, c in enumerate(code)
        if c is not params[0] and re.search(r"\bSMALL\b", "".join(c["source"]))
    ]
    assert not later, (
        f"{path.name}: code cells {later} read SMALL; set what depends on it in the parameters "
        "cell."
    )


def _exec_cells(path: pathlib.Path, cwd: pathlib.Path, monkeypatch, also: str = "") -> dict:
    """Runs `path`'s parameters cell, the set-up cell after it and, with `also`, the first code
    cell containing `also`, in this process with `cwd` as the working directory (the kernel's);
    returns their namespace."""
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("GDPO_NB_FULL", "0")
    monkeypatch.delenv("GDPO_RESULTS_DIR", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the set-up cell may prepend ROOT
    nb = json.loads(path.read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    tags = [c["metadata"].get("tags", []) for c in nb["cells"] if c["cell_type"] == "code"]
    start = next(i for i, t in enumerate(tags) if "parameters" in t)
    cells = code[start : start + 2] + ([next(c for c in code if also in c)] if also else [])
    ns: dict = {"__name__": "__notebook__"}
    for src in cells:
        exec(compile(src, str(path), "exec"), ns)
    return ns


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
@pytest.mark.parametrize("where", ["notebooks", "root", "docs"])
def test_notebook_finds_the_repository_from_its_working_directory(
    path: pathlib.Path, where: str, monkeypatch
):
    # Jupyter and nbconvert start the kernel in notebooks/; papermill keeps the caller's folder,
    # typically the repository root, where the parent of the working directory is not the root.
    cwd = {"notebooks": NB_DIR, "root": ROOT, "docs": ROOT / "docs"}[where]
    ns = _exec_cells(path, cwd, monkeypatch)
    assert ns["ROOT"] == ROOT, (path.name, where, ns["ROOT"])


def _write_run(run_dir: pathlib.Path) -> None:
    run_dir.mkdir(parents=True)
    lines = [{"step": t, "reward/toy_format/mean": 0.5} for t in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_results_notebook_labels_a_run_by_its_innermost_estimator_folder(tmp_path, monkeypatch):
    load = _exec_cells(NB_DIR / "04_results.ipynb", NB_DIR, monkeypatch, "def load_results")[
        "load_results"
    ]
    # Experiment folders that start with an estimator name hold runs of other estimators.
    ok = tmp_path / "ok"
    for rel in (
        "gdpo_vs_grpo/grpo/seed0",
        "gdpo_vs_grpo/gdpo/seed1",
        "grpo-lr1e-6/gdpo_no_bn/seed2",
        "gdpo.old/grpo_no_std_seed3",
        "seed9_sweep/gdpo/seed4",  # the innermost seed too (the outermost was taken)
        "sft/seed0",  # no estimator: skipped
    ):
        _write_run(ok / rel)
    runs = load(ok)
    got = set(zip(runs.estimator, runs.seed))
    want = {("grpo", 0), ("gdpo", 1), ("gdpo_no_bn", 2), ("grpo_no_std", 3), ("gdpo", 4)}
    assert got == want, got
    # Two folders that are only estimator names: no way to tell which labels the run.
    for i, rel in enumerate(("gdpo/grpo/seed0", "gdpo/grpo_seed0")):
        _write_run(tmp_path / f"ambiguous{i}" / rel)
        with pytest.raises(ValueError, match=r"names two estimators, \['gdpo', 'grpo'\]"):
            load(tmp_path / f"ambiguous{i}")
    # Files that were all skipped are not "no metrics.jsonl".
    for rel in ("sft/seed0", "base"):
        _write_run(tmp_path / "skipped" / rel)
    with pytest.raises(FileNotFoundError, match="found 2 metrics.jsonl, none with an estimator"):
        load(tmp_path / "skipped")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl under"):
        load(tmp_path / "empty")


def _install_kernel_spec(prefix: pathlib.Path, staging: pathlib.Path) -> dict:
    """Installs the kernel spec for this interpreter under `prefix`; returns its kernel.json.
    ipykernel's `install` stages the spec in `tempfile.mkdtemp(suffix="_kernels")` and
    removes only the spec inside it, so every run left an empty `tmp*_kernels` folder in
    the machine's temp folder: it stages in `staging` instead."""
    from ipykernel.kernelspec import install

    staging.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(staging))
        install(kernel_name=KERNEL, prefix=str(prefix), display_name="gdpo_jax test")
    return json.loads((prefix / "share/jupyter/kernels" / KERNEL / "kernel.json").read_text())


def test_the_kernel_spec_leaves_nothing_in_the_temp_folder(tmp_path):
    def left() -> set[str]:
        return {p.name for p in pathlib.Path(tempfile.gettempdir()).glob("tmp*_kernels")}

    before = left()
    spec = _install_kernel_spec(tmp_path / "jupyter", tmp_path / "staging")
    assert spec["argv"][0] == sys.executable and left() == before


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """JUPYTER_PATH with a kernel spec for this interpreter; the env the kernel inherits."""
    prefix = tmp_path_factory.mktemp("jupyter")
    spec = _install_kernel_spec(prefix, tmp_path_factory.mktemp("kernel_staging"))
    assert spec["argv"][0] == sys.executable, spec["argv"]
    env = {
        "JUPYTER_PATH": str(prefix / "share/jupyter"),
        "GDPO_NB_FULL": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        # A user's notebook sees one CPU device, not the 8 fake ones of the test session.
        "XLA_FLAGS": re.sub(
            r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", "")
        ).strip(),
    }
    return env


def _run_notebook(path: pathlib.Path, kernel_env, monkeypatch, tmp_path) -> list:
    """Executes `path` in notebooks/ (as jupyter nbconvert --execute does) on this
    interpreter; returns its code cells' outputs, after checking none is an error."""
    import nbformat
    from nbclient import NotebookClient

    for k, v in kernel_env.items():
        monkeypatch.setenv(k, v)
    # The notebooks keep their results in tempfile.mkdtemp() folders for the user to
    # open; under test those go to pytest's tmp_path, which pytest prunes.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    nb = nbformat.read(path, as_version=4)
    # First, prove the kernel is this interpreter (not whatever "python3" resolves to).
    nb.cells.insert(
        0,
        nbformat.v4.new_code_cell(
            f"import sys\nassert sys.executable == {sys.executable!r}, sys.executable"
        ),
    )
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNEL,
        resources={"metadata": {"path": str(NB_DIR)}},
    )
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError with the cell and traceback on failure
    seconds = time.perf_counter() - t0
    print(f"{path.name}: {seconds:.1f} s")
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    return outputs


def _stream_text(outputs: list) -> str:
    return "".join("".join(o.get("text", "")) for o in outputs if o.get("output_type") == "stream")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path: pathlib.Path, kernel_env, monkeypatch, tmp_path):
    # A GDPO_RESULTS_DIR exported by the caller would replace 04's placeholder path.
    monkeypatch.delenv("GDPO_RESULTS_DIR", raising=False)
    outputs = _run_notebook(path, kernel_env, monkeypatch, tmp_path)
    if path.stem == "04_results":
        assert "SYNTHETIC PLACEHOLDER" in _stream_text(outputs)


@pytest.mark.slow
def test_results_notebook_reads_a_results_dir_relative_to_the_repository(
    kernel_env, monkeypatch, tmp_path
):
    # docs/notebooks.md's `GDPO_RESULTS_DIR=runs/... jupyter nbconvert --execute` runs the
    # kernel in notebooks/, where the repository-relative path did not exist. The runs sit
    # under an experiment folder whose name starts with "gdpo": each run keeps its own label.
    results = tmp_path / "results"
    for est in ("grpo", "gdpo"):
        for seed in (0, 1):
            run = results / "gdpo_vs_grpo" / est / f"seed{seed}"
            run.mkdir(parents=True)
            lines = [
                {"step": t, "reward/toy_format/mean": t / 10 + seed / 100, "eval/format": t / 10}
                for t in range(1, 11)
            ]
            (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rel = os.path.relpath(results, ROOT)  # relative to the repository, not to notebooks/
    assert not (NB_DIR / rel).is_dir()
    monkeypatch.setenv("GDPO_RESULTS_DIR", rel)
    outputs = _run_notebook(NB_DIR / "04_results.ipynb", kernel_env, monkeypatch, tmp_path)
    text = _stream_text(outputs)
    assert f"Results from {ROOT / rel}" in text and "PLACEHOLDER" not in text, text[-2000:]
    assert "{'gdpo': 2, 'grpo': 2}" in text  # both estimators, two seeds each


def test_results_notebook_names_the_runs_that_end_early(monkeypatch, capsys):
    # A killed run's last logged value counted as "final" in the table without a word.
    path = NB_DIR / "04_results.ipynb"
    ns = _exec_cells(path, NB_DIR, monkeypatch)
    cell = next(
        "".join(c["source"])
        for c in json.loads(path.read_text())["cells"]
        if "def final_table" in "".join(c["source"])
    )
    exec(compile(cell.split("\n\n\nfinal = ")[0], str(path), "exec"), ns)  # the def alone
    pd = ns["pd"]
    ns["ests"] = ["grpo", "gdpo"]
    rows = [
        {"estimator": est, "seed": seed, "step": step, "eval/format": step / 200}
        for est in ("grpo", "gdpo")
        for seed in (0, 1)
        for step in range(20, (60 if (est, seed) == ("gdpo", 1) else 200) + 1, 20)
    ]
    table = ns["final_table"](pd.DataFrame(rows), ["eval/format"])
    out = capsys.readouterr().out
    assert "runs that end before step 200" in out and "GDPO seed 1 at step 60" in out
    assert "GRPO seed" not in out
    assert table.loc["GDPO", "last step"] == "60-200" and table.loc["GRPO", "last step"] == "200"
