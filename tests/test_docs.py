"""The README is a front page and docs/ is navigable: no broken relative link or anchor.

Checks README.md and every docs/*.md (not docs/results/** or docs/benchmarks/**, which
scripts write): each relative link names a file or directory that exists, and each
`#anchor` names a heading of the target page (GitHub's slug rules). The README stays a
front page (<= 220 lines) and keeps the two set-up commands, `make demo` and `make test`
(`.ci/run` runs `make test`). The pod example of docs/configs.md validates on 64 devices.
Every test the docs and sources cite by name exists.
"""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from gdpo_jax.hostenv import HUGETLB_TUNABLE

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 220

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`\n]*`")
# [text](target) or ![alt](target), target without spaces, optional "title".
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def doc_pages() -> list[Path]:
    """README.md and the hand-written pages docs/*.md (sorted)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose_lines(text: str) -> list[str]:
    """Lines outside fenced code blocks (links and headings inside fences do not count)."""
    out, in_fence = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            out.append(line)
    return out


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, markup and punctuation dropped, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps unicode letters and digits, as GitHub does
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    """Every heading anchor of a markdown page, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    """Link targets of a page that are not external URLs."""
    out = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(_INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            out.append(target)
    return out


def broken_links(path: Path) -> list[str]:
    """One message per relative link of `path` whose file or #anchor does not exist."""
    errors = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        rel = dest.relative_to(ROOT).as_posix() if dest.is_relative_to(ROOT) else str(dest)
        if not dest.exists():
            errors.append(f"{target}: no such file {rel}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors_of(dest):
            errors.append(f"{target}: no heading with anchor #{anchor} in {rel}")
    return errors


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    errors = broken_links(page)
    assert not errors, f"{page.relative_to(ROOT)}: broken links:\n" + "\n".join(errors)


def test_every_docs_page_links_back_to_the_index() -> None:
    missing = [
        p.name
        for p in doc_pages()[1:]
        if p.name != "index.md"
        and not any(t.split("#")[0] == "index.md" for t in relative_links(p))
    ]
    assert not missing, f"docs pages without a link to index.md: {missing}"


def test_index_links_every_docs_page() -> None:
    linked = {t.split("#")[0] for t in relative_links(ROOT / "docs" / "index.md")}
    missing = [p.name for p in doc_pages()[1:] if p.name != "index.md" and p.name not in linked]
    assert not missing, f"docs/index.md does not link: {missing}"


def test_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    n = len(text.splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines; move detail to docs/ (max {README_MAX_LINES})"
    )
    for cmd in ("make demo", "make test"):
        assert cmd in text, f"README.md must show the set-up command `{cmd}`"
    assert "make test" in (ROOT / ".ci" / "run").read_text(), ".ci/run must run `make test`"


def test_link_checker_catches_breakage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The checker itself must fail on a missing file and on a missing anchor.
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Title `x` here\n\n## Same\n## Same\n", encoding="utf-8")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#title-x-here) [ok2](a.md#same-1) [ext](https://x.org/nope)\n"
        "`[code](nope.md)`\n```\n[fenced](nope.md)\n```\n"
        "[bad](missing.md) [badanchor](a.md#nothing) [self](#none)\n",
        encoding="utf-8",
    )
    errors = broken_links(page)
    assert len(errors) == 3, errors
    assert "missing.md" in errors[0] and "#nothing" in errors[1] and "#none" in errors[2]


def test_github_slug() -> None:
    assert github_slug("The maths: `gdpo_jax.core`") == "the-maths-gdpo_jaxcore"
    assert github_slug("Outcome (math, length reward not gated)") == (
        "outcome-math-length-reward-not-gated"
    )
    assert github_slug("Multi-host (several processes)") == "multi-host-several-processes"


def _pod_commands() -> list[list[str]]:
    """The `experiments.train` commands of the fenced block in docs/configs.md marked pod-64."""
    text = (ROOT / "docs" / "configs.md").read_text(encoding="utf-8")
    m = re.search(r"```bash\n# pod-64[^\n]*\n(.*?)```", text, re.S)
    assert m, "docs/configs.md lost its '# pod-64' example block"
    joined = m.group(1).replace("\\\n", " ")
    return [shlex.split(ln) for ln in joined.splitlines() if "experiments.train" in ln]


def test_pod_example_validates_on_64_devices() -> None:
    # The old README's pod example (num_microbatches=16 for every config) failed validation
    # for tool calling on 64 devices: 32-row micro-batches do not split over 64 devices.
    from gdpo_jax.train.config import validate_config

    cmds = _pod_commands()
    assert len(cmds) == 3, cmds
    for argv in cmds:
        spec = next(a.split("=", 1)[1] for a in argv if a.startswith("--config="))
        path, _, arg = spec.partition(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        cfg = module.get_config(arg)
        for a in argv:
            if a.startswith("--config.") and "=" in a:
                key, val = a[len("--config.") :].split("=", 1)
                try:
                    val = ast.literal_eval(val)
                except (ValueError, SyntaxError):
                    pass
                node = cfg
                *parents, leaf = key.split(".")
                for p in parents:
                    node = node[p]
                node[leaf] = val
        validate_config(cfg, num_devices=64)


def test_no_deprecated_hub_cli_in_text() -> None:
    # `huggingface-cli` is deprecated in favour of `hf` (huggingface_hub >= 0.34): docs,
    # docstrings and error messages must name `hf download`.
    this = Path(__file__).resolve()
    hits = [
        p.relative_to(ROOT).as_posix()
        for folder in ("gdpo_jax", "configs", "experiments", "benchmarks", "docs", "tests")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".md", ".ipynb")
        and p != this
        and "huggingface-cli" in p.read_text(encoding="utf-8", errors="ignore")
    ]
    if "huggingface-cli" in (ROOT / "README.md").read_text(encoding="utf-8"):
        hits.append("README.md")
    assert not hits, f"`huggingface-cli` (deprecated; use `hf download`) in: {hits}"


def _what_is_where() -> str:
    """The "What is where" section of docs/getting-started.md (up to the next `## `)."""
    text = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    m = re.search(r"^## What is where\n(.*?)^## ", text, re.S | re.M)
    assert m, "docs/getting-started.md lost its '## What is where' section"
    return m.group(1)


def map_mismatches(section: str, root: Path) -> list[str]:
    """Modules of `root`/gdpo_jax missing from the map's table rows, and .py names it lists
    that no module of that row's folders has."""
    rows = [ln for ln in section.splitlines() if ln.startswith("|") and "gdpo_jax/" in ln]
    errors = []
    for path in sorted((root / "gdpo_jax").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        folder, name = rel.rsplit("/", 1)
        # A module is named in a row that names its folder (`gdpo_jax/core/`, or the
        # folder of an earlier `gdpo_jax/.../x.py` in the row) and its file name; a
        # package's __init__.py by its folder `gdpo_jax/x/` alone.
        named = any(f"`{name}`" in r and f"{folder}/" in r for r in rows)
        named = named or any(f"`{rel}`" in r for r in rows)
        if name == "__init__.py":
            named = named or any(f"`{folder}/`" in r for r in rows)
        if not named:
            errors.append(f"{rel} is not in the map")
    for row in rows:
        folders = set(re.findall(r"`(gdpo_jax(?:/\w+)*)/", row))
        for name in re.findall(r"`(?:gdpo_jax/(?:\w+/)*)?(\w+\.py)`", row):
            if not any((root / f / name).exists() for f in folders):
                errors.append(f"{name} (row {row[:40]}...) does not exist")
    return errors


def test_what_is_where_matches_the_package() -> None:
    # The map of docs/getting-started.md names every module of gdpo_jax/ and nothing else.
    errors = map_mismatches(_what_is_where(), ROOT)
    assert not errors, "docs/getting-started.md 'What is where':\n" + "\n".join(errors)


def folder_mismatches(section: str, root: Path, folder: str) -> list[str]:
    """Files `folder`/*.py (not __init__.py) that the map's `folder/` row names neither
    by name nor by a pattern (`paper_*.py`), and names it lists that do not exist."""
    import fnmatch

    rows = [ln for ln in section.splitlines() if ln.startswith(f"| `{folder}/`")]
    names = [n for r in rows for n in re.findall(r"`([\w*]+\.py)`", r)]
    errors = []
    for path in sorted((root / folder).glob("*.py")):
        if path.name != "__init__.py" and not any(fnmatch.fnmatch(path.name, n) for n in names):
            errors.append(f"{folder}/{path.name} is not in the map")
    for n in names:
        if not list((root / folder).glob(n)):
            errors.append(f"{folder}/{n} (in the map) does not exist")
    return errors


def test_what_is_where_names_every_experiment_and_config(tmp_path: Path) -> None:
    # restat_studies.py and the study configs were missing from the map (only
    # gdpo_jax/ was checked).
    section = _what_is_where()
    errors = [e for f in ("experiments", "configs") for e in folder_mismatches(section, ROOT, f)]
    assert not errors, "docs/getting-started.md 'What is where':\n" + "\n".join(errors)
    (tmp_path / "configs").mkdir()
    for f in ("__init__.py", "a.py", "b_1.py", "new.py"):
        (tmp_path / "configs" / f).write_text("", encoding="utf-8")
    fake = "| `configs/` | `a.py`, `b_*.py`, `gone.py` | x |\n"
    assert folder_mismatches(fake, tmp_path, "configs") == [
        "configs/new.py is not in the map",
        "configs/gone.py (in the map) does not exist",
    ]


def test_map_checker_catches_a_new_and_a_removed_module(tmp_path: Path) -> None:
    (tmp_path / "gdpo_jax" / "core").mkdir(parents=True)
    for f in ("gdpo_jax/__init__.py", "gdpo_jax/core/a.py", "gdpo_jax/core/new.py"):
        (tmp_path / f).write_text("", encoding="utf-8")
    section = (
        "| core | `gdpo_jax/core/`: `a.py`, `gone.py` | x |\n| top | `gdpo_jax/__init__.py` | y |\n"
    )
    errors = map_mismatches(section, tmp_path)
    assert len(errors) == 2, errors
    assert "core/new.py is not in the map" in errors[0] and "gone.py" in errors[1]


_TEST_NAME = re.compile(r"\b(test_[a-z0-9_]*[a-z0-9])\b")


def missing_tests(texts: dict[str, str], tests_dir: Path) -> list[str]:
    """One message per test a text cites (`test_...`) that no `def test_...` of
    tests_dir defines. Test modules (tests/test_x.py) and families (`test_train_`)
    are not tests; a name ending in ``...`` is a prefix and must start some test."""
    defined: set[str] = set()
    modules = {f.stem for f in tests_dir.glob("test_*.py")}
    for f in tests_dir.glob("*.py"):
        defined |= set(re.findall(r"^\s*def (test_\w+)", f.read_text(encoding="utf-8"), re.M))
    errors = []
    for where, text in texts.items():
        for m in _TEST_NAME.finditer(text):
            name = m.group(1)
            if name in modules or name in defined or text[m.end() : m.end() + 1] == "_":
                continue
            if text[m.end() : m.end() + 3] == "..." and any(d.startswith(name) for d in defined):
                continue
            errors.append(f"{where}: {name} is not a test in {tests_dir.name}/")
    return errors


def _cited_tests_texts() -> dict[str, str]:
    """The README, the docs pages and the package's, benchmarks' and experiments' sources."""
    paths = doc_pages() + [
        p for d in ("gdpo_jax", "benchmarks", "experiments") for p in (ROOT / d).rglob("*.py")
    ]
    return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in paths}


def test_the_tests_the_docs_cite_exist() -> None:
    # A renamed test left its old name in testing.md once; every cited name must be defined.
    errors = sorted(set(missing_tests(_cited_tests_texts(), ROOT / "tests")))
    assert not errors, "\n".join(errors)


def test_cited_test_checker_catches_a_missing_test(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("def test_here():\n    pass\n", encoding="utf-8")
    texts = {
        "ok.md": "`test_a` and `test_here`, family `test_train_*`, prefix test_he...",
        "bad.md": "`test_gone` and the prefix test_no...",
    }
    assert missing_tests(texts, tmp_path) == [
        "bad.md: test_gone is not a test in " + tmp_path.name + "/",
        "bad.md: test_no is not a test in " + tmp_path.name + "/",
    ]


def _plan_table(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """experiments.plan_table, imported without leaving its TPU_* variables in this process."""
    # plan_table sets these with setdefault on import; keep them out of this process's env.
    for var, val in (
        ("TPU_ACCELERATOR_TYPE", "v5litepod-4"),
        ("TPU_WORKER_HOSTNAMES", "localhost"),
    ):
        monkeypatch.setenv(var, val)
    from experiments import plan_table

    return plan_table


def _committed_plan_table(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """(the table experiments.plan_table renders from docs/scale/plans.json, the text between
    the plan-table markers of docs/scale.md)."""
    import json

    plan_table = _plan_table(monkeypatch)
    plans = json.loads((ROOT / "docs" / "scale" / "plans.json").read_text(encoding="utf-8"))
    plans = {k: plan_table.rederive(v) for k, v in plans.items()}
    doc = (ROOT / "docs" / "scale.md").read_text(encoding="utf-8")
    assert plan_table.TABLE_START in doc and plan_table.TABLE_END in doc, (
        "docs/scale.md lost its plan-table markers"
    )
    section = doc.split(plan_table.TABLE_START, 1)[1].split(plan_table.TABLE_END, 1)[0]
    return plan_table.render(plans), section


def test_scale_table_is_the_committed_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    # The table of docs/scale.md is generated: no figure in it is typed in by hand.
    table, section = _committed_plan_table(monkeypatch)
    assert table in section, (
        "docs/scale.md's plan table differs from docs/scale/plans.json; regenerate it with "
        "`python -m experiments.plan_table` (it resumes), do not edit it by hand"
    )


def _assert_quotes(text: str, figures: tuple[str, ...], where: str) -> None:
    """Every figure (computed by the test from committed data) stands in `text`."""
    for figure in figures:
        assert figure in text, f"{where} should say {figure!r}"


def _committed_run_in_benchmarks(
    name: str, render: Callable[[dict], str], command: str
) -> tuple[dict, str]:
    """The committed run docs/benchmarks/<name> and benchmarks.md's text (whitespace
    folded), after checking that `render(run)` (its table) stands in that text;
    `command` is what writes the run, named when the two differ."""
    import json

    res = json.loads((ROOT / "docs" / "benchmarks" / name).read_text())
    flat = " ".join((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").split())
    assert " ".join(render(res).split()) in flat, (
        f"docs/benchmarks.md's table differs from docs/benchmarks/{name} ({command} --out <it>)"
    )
    return res, flat


def _committed_table_in(renderer: str, data: str, page: str, rows: int = 2) -> str:
    """Renders experiments.scale_tables.<renderer> from docs/scale/<data>/ and checks the
    table (a header and at least `rows` rows) stands in docs/<page>; returns the page."""
    from experiments import scale_tables

    table = getattr(scale_tables, renderer)(str(ROOT / "docs" / "scale" / data))
    doc = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert table.count("\n") >= rows + 1 and table in doc, (
        f"docs/{page}'s table differs from docs/scale/{data}/*.json "
        f"(experiments.scale_tables.{renderer} renders it)"
    )
    return doc


def test_attention_kernel_table_is_the_committed_plans() -> None:
    # docs/models.md's kernel comparison is rendered from docs/scale/attention/*.json.
    _committed_table_in("attention_table", "attention", "models.md")


def test_sampler_table_and_its_prose_are_the_committed_plans() -> None:
    # docs/scale.md's static-vs-continuous sampler table is rendered from
    # docs/scale/sampler/*.json, and the differences its prose quotes are computed here.
    import json

    from gdpo_jax.scale.report import format_plan

    directory = ROOT / "docs" / "scale" / "sampler"
    doc = _committed_table_in("sampler_table", "sampler", "scale.md", rows=7)
    plans = {p.stem: json.loads(p.read_text()) for p in directory.glob("*.json")}
    static, cont = plans["math-1.5b_8xh100_static"], plans["math-1.5b_8xh100_continuous-64"]
    gib = 2**30
    temps = cont["programs"]["generate"]["temp_gib"] - static["programs"]["generate"]["temp_gib"]
    gathered = cont["programs"]["generate"]["gathered_params_bytes"] / gib
    kv = (cont["per_device"]["kv_cache"] - static["per_device"]["kv_cache"]) / gib
    prose = doc.split("<!-- /sampler-table -->", 1)[1].split("\n## ", 1)[0]
    figures = (
        f"{temps:.1f} GiB more",
        f"({gathered:.2f} GiB)",
        f"({kv:.2f} GiB",
        f"{gathered + kv:.1f} of it",
    )
    _assert_quotes(prose, figures, "docs/scale.md's sampler prose")
    line = next(x for x in format_plan(cont).splitlines() if x.startswith("sampler:"))
    assert f"\n    {line}\n" in doc, "docs/scale.md's printed sampler line is not the plan's"

    # The decode's phases: a prefix of one cache (the default), copies, one phase.
    def gen(name: str, key: str) -> float:
        return plans[name]["programs"]["generate"][key]

    def decode_s(name: str) -> float:
        return plans[name]["roofline"]["decode"]

    r4, rc, r1 = (f"math-1.5b_8xh100_{v}" for v in ("static", "static-copy", "static-1"))
    q4, qc, q1 = (f"math-qwen3-4b_v5p-8_{v}" for v in ("static", "static-copy", "static-1"))
    assert [gen(n, "decode_phases") for n in (r4, rc, r1, q4, qc, q1)] == [4, 4, 1, 4, 4, 1]
    assert [gen(n, "decode_growth") for n in (r4, rc, q4, qc)] == ["prefix", "copy"] * 2
    assert gen(q4, "fits") and not gen(qc, "fits") and gen(q1, "fits")
    assert decode_s(r4) == decode_s(rc) and decode_s(q4) == decode_s(qc)  # the same reads
    prose = doc.split("## The static decode's phases", 1)[1].split("\n## ", 1)[0]
    figures = (
        f"{gen(rc, 'temp_gib') - gen(r1, 'temp_gib'):.2f} GiB more temporaries",
        f"({gen(rc, 'temp_gib'):.2f} against {gen(r1, 'temp_gib'):.2f})",
        f"{gen(qc, 'temp_gib') - gen(q1, 'temp_gib'):.2f} GiB more",
        f"({gen(qc, 'temp_gib'):.2f} against {gen(q1, 'temp_gib'):.2f})",
        f"{gen(qc, 'total_gib'):.2f} of {plans[qc]['usable_gib']:.2f} GiB",
        f"{gen(r4, 'temp_gib'):.2f} and {gen(q4, 'temp_gib'):.2f} GiB",
        f"fits at {gen(q4, 'total_gib'):.2f}",
        f"{decode_s(r1) / decode_s(r4):.2f}x",
        f"{decode_s(q1) / decode_s(q4):.2f}x",
    )
    _assert_quotes(prose, figures, "docs/scale.md's phases prose")


def test_check_table_and_its_prose_are_the_committed_runs() -> None:
    # docs/scale.md's plan-against-measurement table is rendered from docs/scale/check/,
    # and every figure its prose quotes is computed here from the same JSON.
    import json

    directory = ROOT / "docs" / "scale" / "check"
    doc = _committed_table_in("check_table", "check", "scale.md", rows=3)
    from gdpo_jax.scale.measure import compare

    def load(name):
        return json.loads((directory / f"{name}.json").read_text())

    gib, base = 2**30, "math-1.5b_1xh200"
    runs = {n: load(n) for n in (base, f"{base}_chunk-256", f"{base}_continuous-32")}
    rows = {
        (n, r["program"]): r
        for n, run in runs.items()
        for r in compare(load(f"plan_{n}"), run["measured"])
    }
    static = [r for (n, _), r in rows.items() if n != f"{base}_continuous-32"]
    worst = max(abs(r["memory_ratio"] - 1) for r in rows.values())
    over = max(r["measured_peak_bytes"] - r["planned_bytes"] for r in rows.values()) / gib
    temps = max(abs(r["device_temps"] - r["planned_temps"]) for r in static) / gib
    m = runs[base]["measured"]
    resident = m["step"]["resident_bytes"] / gib
    compile_step = m["step"]["compile_peak_bytes"] / gib
    step256 = runs[f"{base}_chunk-256"]["measured"]["step"]
    plan = load(f"plan_{base}")
    assert "logprob" not in plan["programs"]  # "these plans have no `logprob` program"
    assert plan["programs"]["generate"]["decode_layers"] == "fused"
    # One chunk of f32 logits: rows per micro-batch x 512 positions x the vocabulary.
    from configs.paper_common import MODELS

    logits = 64 // 4 * 512 * MODELS["r1-distill-1.5b"].vocab_size * 4 / gib
    ratios = [r["time_ratio"] for r in static]
    per_step_ms = m["generate"]["median_s"] / 1024 * 1e3
    roof_ms = (plan["roofline"]["prefill"] + plan["roofline"]["decode"]) / 1024 * 1e3
    cont_run = runs[f"{base}_continuous-32"]["measured"]["generate"]["median_s"]
    cont_ratio = rows[(f"{base}_continuous-32", "generate")]["time_ratio"]
    prose = doc.split("<!-- /check-table -->", 1)[1].split("\n## ", 1)[0]
    figures = (
        f"within {worst * 100:.1f} %",  # rounded: the largest is the 256-chunk step's
        f"{over:.2f} GiB over",
        f"within {max(temps, 0.01):.2f} GiB",
        f"measured {resident:.2f} GiB",
        f"{logits:.2f} GiB",
        f"peaked at {compile_step:.2f} GiB: {resident:.2f} resident plus "
        f"{compile_step - resident:.2f}",
        f"step compiled at {step256['compile_peak_bytes'] / gib:.2f} GiB "
        f"({(step256['compile_peak_bytes'] - step256['resident_bytes']) / gib:.2f} of scratch",
        f"{min(ratios):.1f}-{max(ratios):.1f}x below",
        f"ran at {rows[(base, 'step')]['mfu'] * 100:.0f} % MFU",
        f"{per_step_ms:.1f} ms per new token against {roof_ms:.1f} ms",
        f"{cont_run:.2f} s",
    )
    _assert_quotes(prose, figures, "docs/scale.md's check prose")
    bench = " ".join((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").split())
    assert f"({rows[(base, 'generate')]['time_ratio']:.1f}x in its run of" in bench
    # "Both stay under the steps' own runs here".
    assert compile_step < m["step"]["peak_bytes"] / gib
    assert step256["compile_peak_bytes"] < step256["peak_bytes"]
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    roofline = f"{min(ratios):.1f}-{max(ratios):.1f}x the roofline ({cont_ratio:.1f}x for"
    _assert_quotes(limits, (figures[0], roofline), "docs/limits.md")
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert figures[0] in readme, f"README.md should say {figures[0]!r}"


def test_gpu_decode_table_is_the_committed_output() -> None:
    # docs/benchmarks.md's GPU decode table quotes docs/benchmarks/decode_weights_h200.txt
    # (the probe's verbatim output); the speed-ups are computed here from its lines.
    text = (ROOT / "docs" / "benchmarks" / "decode_weights_h200.txt").read_text()
    runs = {
        m.group(1): (float(m.group(2)), float(m.group(3)))
        for m in re.finditer(r"^(\w+) first ([\d.]+) s, calls .* ms/step ([\d.]+)$", text, re.M)
    }
    same = {
        m.group(1): (m.group(2) == "True", float(m.group(3)))
        for m in re.finditer(
            r"^(\w+) tokens equal to scan_f32: (\w+) max \|dlogp\|: (\S+)$", text, re.M
        )
    }
    assert set(runs) == set(same) == {"scan_f32", "scan_castonce", "fused_f32", "fused_castonce"}
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = doc.split("## The decode on a GPU at a paper model's shapes", 1)[1].split("\n## ")[0]
    base = runs["scan_f32"][1]
    for name, (first, ms) in runs.items():
        eq, diff = same[name]
        cell = (
            "(reference)"
            if name == "scan_f32"
            else "yes (bit-equal)"
            if eq and diff == 0
            else (f"no (max log-prob difference {diff:.2f})")
        )
        row = f"| {ms:.2f} | {base / ms:.2f}x | {cell} | {first:.1f} |"
        assert row in section, f"docs/benchmarks.md's GPU decode table should hold {row!r}"
    fused = base / runs["fused_castonce"][1]
    sampling = " ".join((ROOT / "docs" / "sampling.md").read_text(encoding="utf-8").split())
    assert f"decoded {fused:.1f}x faster than the scan" in sampling
    scale = " ".join((ROOT / "docs" / "scale.md").read_text(encoding="utf-8").split())
    # The probe times whole calls: its figure is per new token, the prefill included.
    assert f"{runs['fused_castonce'][1]:.2f} ms per new token at 256 new tokens" in scale
    assert "| ms per new token (the call / 256, prefill included) |" in section


def test_tune_table_is_the_committed_run() -> None:
    # docs/training.md's micro-batch table is format_table of the committed tuner JSON,
    # and the prose's speed-ups are computed from it here.
    import json

    from gdpo_jax.train.tune import format_table

    path = ROOT / "docs" / "benchmarks" / "tune_smollm2_toolcall_amd-epyc-avx512-2c.json"
    res = json.loads(path.read_text(encoding="utf-8"))
    doc = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    table = format_table(res)
    assert table in doc, (
        "docs/training.md's micro-batch table differs from the committed tuner run "
        "(gdpo_jax.train.tune.format_table renders it)"
    )
    prose = doc.split("<!-- /tune-table -->", 1)[1].split("\n## ", 1)[0]
    med = {int(k): v["median_s"] for k, v in res["counts"].items() if v["status"] == "ok"}
    fastest = res["fastest"]
    assert f"--config.algo.num_microbatches={fastest}" in prose
    for k in med:
        if k != fastest:
            assert f"{med[k] / med[fastest]:.2f}x" in prose, (k, med)
    assert res["machine"]["cpu_model"] in prose
    rerun = json.loads(path.with_name(path.stem + "_rerun.json").read_text(encoding="utf-8"))
    med = {int(k): v["median_s"] for k, v in rerun["counts"].items()}
    assert f"{med[1] / med[2]:.2f}x in a rerun" in prose


def test_scale_prose_roofline_minutes_are_the_committed_plans() -> None:
    # "What the table says" quotes the 7B and 4B math / code recipes' roofline on 8xH100.
    import json

    plans = json.loads((ROOT / "docs" / "scale" / "plans.json").read_text(encoding="utf-8"))
    minutes = [
        p["est_step_s"] / 60
        for key, p in plans.items()
        if key.endswith("@8xh100")
        and key.split("@")[0] in ("math-r1-7b", "math-qwen3-4b", "code-r1-7b")
    ]
    figure = f"({min(minutes):.0f}-{max(minutes):.0f} min per RL step on"
    doc = " ".join((ROOT / "docs" / "scale.md").read_text(encoding="utf-8").split())
    assert len(minutes) == 3 and figure in doc, f"docs/scale.md should say {figure!r}"


def test_scale_prose_binding_program_figures_are_the_committed_plans() -> None:
    # "What the table says": which program binds, and tool calling 1.5B's sampler.
    import json

    plans = json.loads((ROOT / "docs" / "scale" / "plans.json").read_text(encoding="utf-8"))
    not_sampler = [k for k, p in plans.items() if p["peak_program"] != "generate"]
    assert not_sampler == ["math-r1-7b@v5p-32"], not_sampler
    p7 = plans["math-r1-7b@v5p-32"]["programs"]
    tool = plans["tool-1.5b@8xh100"]
    figures = (
        f"(the step, by {p7['step']['total_gib'] - p7['generate']['total_gib']:.1f} GiB)",
        f"{tool['programs']['generate']['rows_per_call']} rows in one call",
        f"{tool['per_device']['kv_cache'] / 2**30:.1f} GiB of bf16 cache per device",
        f"{tool['programs']['generate']['temp_gib']:.1f} GiB of temporaries",
    )
    doc = " ".join((ROOT / "docs" / "scale.md").read_text(encoding="utf-8").split())
    _assert_quotes(doc, figures, "docs/scale.md's 'What the table says'")


def test_readme_scale_figures_are_in_the_committed_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # The README's "Measured so far" quotes the planner's table: every number on its
    # scale line must be a cell (or part of one) of that table, and it must link the page.
    _, section = _committed_plan_table(monkeypatch)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = [
        ln
        for ln in text.split("## Measured so far", 1)[1].split("\n## ", 1)[0].split("\n- ")
        if "docs/scale.md)" in ln  # the page itself: the plan-table line, not a section
    ]
    assert lines, "README.md 'Measured so far' must point to docs/scale.md"
    prose = re.sub(r"\]\([^)]*\)", "]", " ".join(lines))  # link targets are not figures
    quoted = re.findall(r"(?<![\d.])\d+(?:\.\d+)?", prose)
    missing = [
        n for n in quoted if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d]|\.\d)", section)
    ]
    assert not missing, f"README.md quotes {missing}, not in docs/scale.md's plan table"


# ------------------------------------------------------- benchmark tables per machine kind
def test_benchmark_summary_is_the_committed_machine_runs() -> None:
    # docs/benchmarks/summary.md is generated from docs/benchmarks/machines/*.json.
    from benchmarks import summary

    bench = ROOT / "docs" / "benchmarks"
    want = summary.summary_markdown(str(bench / "machines"))
    assert (bench / "summary.md").read_text(encoding="utf-8") == want, (
        "docs/benchmarks/summary.md differs from docs/benchmarks/machines/*.json; regenerate "
        "it with `python -m benchmarks.run_all --summary_only --out_dir docs/benchmarks`"
    )
    assert len(list((bench / "machines").glob("*.json"))) >= 1
    # The run time benchmarks.md quotes is the avx512 kind's recorded one.
    import json

    run = json.loads((bench / "machines" / "amd-epyc-avx512-2c.json").read_text())
    minutes = sum(b["seconds"] for b in run["benchmarks"].values()) / 60
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert f"took about {minutes:.0f} minutes on the 2-core avx512 kind" in doc


_RANGE = r"(\d+\.\d\d-\d+\.\d\dx)"
# Each headline ratio the README's speed line quotes, found by the words around it: the
# range must be that key's, so a range under another ratio's label is caught.
README_SPEED_LABELS = {
    "rl_iter_b0.0": rf"an RL iteration {_RANGE} \(beta 0\)",
    "rl_iter_b0.04": rf"an RL iteration \S+ \(beta 0\) and {_RANGE} \(beta 0\.04\)",
    "rl_step_b0.0": rf"its step {_RANGE} \(beta 0\)",
    "rl_step_b0.04": rf"its step \S+ \(beta 0\) and {_RANGE} \(beta 0\.04\)",
    "sampler_greedy": rf"{_RANGE} \(greedy\)",
    "sampler_sampled": rf"{_RANGE} \(sampled\)",
    "sampler_top_k": rf"{_RANGE} \(top-k 50\)",
    "matmul_step": rf"{_RANGE} as fast as PyTorch's at the step's shapes",
    "matmul_decode": rf"{_RANGE} at the decode's",
    "matmul_decode_glue": rf"as the sampler and `generate\(\)` run them, are {_RANGE}",
}


def readme_speed_mismatches(line: str, ranges: dict[str, tuple[float, float]]) -> list[str]:
    """What is wrong with the README's speed line (whitespace-normalized) against the
    summary's ranges ({HEADLINE_COLUMNS key: (min, max)}): a labelled ratio missing or
    not its key's range, or a quoted ratio ("a.bcx", "a.b-c.dx") under no label."""
    bad, labelled = [], set()
    for key, pattern in README_SPEED_LABELS.items():
        m = re.search(pattern, line)
        if m is None:
            bad.append(f"{key}: no range under its label")
            continue
        labelled.add(m.span(1))
        lo, hi = ranges[key]
        if m.group(1) != f"{lo:.2f}-{hi:.2f}x":
            bad.append(f"{key}: quotes {m.group(1)}, the summary's range is {lo:.2f}-{hi:.2f}x")
    for m in re.finditer(r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x\b", line):
        if m.span() not in labelled:
            bad.append(f"{m.group()}: a ratio under no label")
    return bad


def _readme_speed_line() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = [
        ln
        for ln in text.split("## Measured so far", 1)[1].split("\n## ", 1)[0].split("\n- ")
        if "docs/benchmarks/summary.md" in ln
    ]
    assert len(lines) == 1, "README.md 'Measured so far' must link docs/benchmarks/summary.md"
    return " ".join(lines[0].split())


def test_readme_speed_ratios_are_the_ranges_over_machine_kinds() -> None:
    # README states each speed ratio as its range over the committed machine kinds
    # (never one machine's best): each labelled ratio on the speed line must be that
    # ratio's (min, max) in the summary's range table, and no ratio may stand unlabelled.
    from benchmarks import summary

    rows = summary.summary_rows(str(ROOT / "docs" / "benchmarks" / "machines"))
    ranges = {
        k: mm for k in summary.HEADLINE_COLUMNS if (mm := summary.ratio_range(rows, k)) is not None
    }
    assert not readme_speed_mismatches(_readme_speed_line(), ranges)


def test_readme_speed_checker_catches_a_swapped_label_and_an_unlabelled_ratio() -> None:
    from benchmarks import summary

    rows = summary.summary_rows(str(ROOT / "docs" / "benchmarks" / "machines"))
    ranges = {
        k: mm for k in summary.HEADLINE_COLUMNS if (mm := summary.ratio_range(rows, k)) is not None
    }
    line = _readme_speed_line()
    swapped = line.replace("(greedy)", "(GREEDY)").replace("(sampled)", "(greedy)")
    swapped = swapped.replace("(GREEDY)", "(sampled)")
    bad = readme_speed_mismatches(swapped, ranges)
    assert any(b.startswith("sampler_greedy: quotes") for b in bad), bad
    assert any(b.startswith("sampler_sampled: quotes") for b in bad), bad
    extra = line.replace("transformers `generate()`.", "transformers `generate()`, 1.9x at best.")
    assert extra != line
    assert readme_speed_mismatches(extra, ranges) == ["1.9x: a ratio under no label"]


def test_smollm2_rl_section_is_the_committed_run() -> None:
    """benchmarks.md's SmolLM2-size bench_rl table renders the committed run, and its
    prose and the README quote that run's ratios."""
    import json

    from benchmarks import bench_rl

    res = json.loads(
        (ROOT / "docs" / "benchmarks" / "rl_smollm2_amd-epyc-avx512-2c.json").read_text()
    )
    assert res["config"]["model"] == "smollm2" and res["config"]["layers"] == 30
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = doc.split("### At SmolLM2-135M's size", 1)[1].split("\n### ", 1)[0]
    assert bench_rl.table(res) in section, "rl_smollm2_*.json's table differs"
    b0, b4 = res["results"]["beta=0.0"], res["results"]["beta=0.04"]
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    flat = " ".join(section.split())
    for text in (readme, flat):
        assert f"{b0['speedup_iter']:.2f}x" in text and f"{b4['speedup_iter']:.2f}x" in text
        for k in ("speedup_step", "speedup_sample"):  # "a-bx" or "ax-bx", low to high
            lo, hi = sorted((b0[k], b4[k]))
            one = f"{lo:.2f}" == f"{hi:.2f}"  # then quoted once: "a.bcx TRL's at both betas"
            pattern = rf"{lo:.2f}x TRL's at both betas" if one else rf"{lo:.2f}x?-{hi:.2f}x"
            assert re.search(pattern, text), (k, lo, hi)
    ref = b4["gdpo_jax"]["step_s"] - b0["gdpo_jax"]["step_s"]
    assert f"costs ours {ref:.2f} s" in flat
    # The later run, quoted beside it: its ratios, matmul peaks and beta-0 steps.
    later = json.loads(
        (ROOT / "docs" / "benchmarks" / "rl_smollm2_amd-epyc-avx512-2c_later.json").read_text()
    )
    l0, l4 = later["results"]["beta=0.0"], later["results"]["beta=0.04"]
    pk, old_pk = later["matmul_peak_gflops"], res["matmul_peak_gflops"]
    for quote in (
        f"gave {l0['speedup_iter']:.2f}x and {l4['speedup_iter']:.2f}x, but not from our side",
        f"peak was {pk['torch']:.0f} GFLOP/s against XLA's {pk['jax']:.0f} "
        f"({old_pk['torch']:.0f} and {old_pk['jax']:.0f} in the run above)",
        f"step took {l0['trl']['step_s']:.2f} s against {b0['trl']['step_s']:.2f}, "
        f"ours {l0['gdpo_jax']['step_s']:.2f} against {b0['gdpo_jax']['step_s']:.2f}",
    ):
        assert quote in flat, quote


def test_step_profile_tables_are_the_committed_runs() -> None:
    """Each committed profile_step run (one per machine kind profiled) has its
    tables in docs/benchmarks.md."""
    import json

    from benchmarks import profile_step

    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    paths = sorted((ROOT / "docs" / "benchmarks").glob("profile_step*.json"))
    assert len(paths) >= 2
    for path in paths:
        res = json.loads(path.read_text())
        tables = [profile_step.table_markdown(res), profile_step.ab_table_markdown(res)]
        if res.get("scan_layers_ab"):
            tables.append(profile_step.scan_table_markdown(res))
        for table in tables:
            assert table in doc, (
                f"docs/benchmarks.md's step profile tables differ from {path.name}"
                f" (python -m benchmarks.profile_step --trace --out docs/benchmarks/{path.name})"
            )

    # The weight-gradient A/B's speed-ups the prose quotes: the avx512 kind's, and the
    # Intel Xeon kind's against both AMD kinds'.
    def speedups(*names: str) -> tuple[float, float]:
        s = [
            r["speedup"]
            for n in names
            for r in json.loads((ROOT / "docs" / "benchmarks" / n).read_text())["weight_grad_ab"]
        ]
        return min(s), max(s)

    flat = " ".join(doc.split())
    avx512 = speedups("profile_step.json")
    amd = speedups("profile_step.json", "profile_step_avx2.json")
    xeon = speedups("profile_step_xeon.json")
    _assert_quotes(
        flat,
        (
            f"the second table, {avx512[0]:.2f}-{avx512[1]:.2f}x faster steps",
            f"costs {xeon[0]:.2f}-{xeon[1]:.2f}x in step time here (second table), against"
            f" {amd[0]:.2f}-{amd[1]:.2f}x on the AMD kinds",
        ),
        "docs/benchmarks.md (profile_step*.json)",
    )


def test_smollm2_scan_vs_unrolled_table_is_the_committed_run() -> None:
    """The SmolLM2-size step's scan-vs-unrolled A/B (profile_step --model smollm2) is in
    benchmarks.md as committed, and limits.md quotes its speed-ups."""
    import json

    from benchmarks import profile_step

    path = ROOT / "docs" / "benchmarks" / "profile_scan_smollm2_amd-epyc-avx512-2c.json"
    res = json.loads(path.read_text())
    assert res["model"] == "smollm2" and len(res["scan_layers_ab"]) == 2
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert profile_step.scan_table_markdown(res) in doc, (
        "docs/benchmarks.md's SmolLM2 scan-vs-unrolled table differs from"
        f" {path.name} (python -m benchmarks.profile_step --model smollm2 --microbatches 4)"
    )
    lo, hi = sorted(r["speedup"] for r in res["scan_layers_ab"])
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    assert f"{lo:.2f}x-{hi:.2f}x" in limits


def test_rl_iteration_table_is_the_committed_avx512_run() -> None:
    """docs/benchmarks.md's bench_rl table is the run of the machine file it names."""
    import json

    from benchmarks import bench_rl

    path = ROOT / "docs" / "benchmarks" / "machines" / "amd-epyc-avx512-2c.json"
    res = json.loads(path.read_text())["benchmarks"]["bench_rl"]["result"]
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert "machines/amd-epyc-avx512-2c.md" in doc
    assert bench_rl.table(res) in doc, (
        "docs/benchmarks.md's RL iteration table differs from machines/amd-epyc-avx512-2c.json"
        " (render it with benchmarks.bench_rl.table)"
    )
    from benchmarks import summary

    flat = " ".join(doc.split())
    mfu = sorted(r["gdpo_jax"]["step_mfu"] for r in res["results"].values())
    assert f"3M model's step reaches {100 * mfu[0]:.0f}-{100 * mfu[1]:.0f} % on this kind" in flat
    # The targets, per summary.md: its kinds, the step's range, who meets 1.5x.
    rows = summary.summary_rows(str(ROOT / "docs" / "benchmarks" / "machines"))
    n = {2: "two", 3: "three", 4: "four", 5: "five"}[len(rows)]
    steps = [r[k] for r in rows for k in ("rl_step_b0.0", "rl_step_b0.04")]
    assert min(steps) > 1
    met = [r["machine"] for r in rows if min(r["rl_iter_b0.0"], r["rl_iter_b0.04"]) >= 1.5]
    who = {
        (): "none",
        ("amd-epyc-avx512-2c",): "the avx512 kind",
        ("amd-epyc-avx2-2c",): "the avx2 kind",
        ("amd-epyc-avx2-2c", "amd-epyc-avx512-2c"): "both AMD EPYC kinds",
    }.get(tuple(met), ", ".join(met))
    sampled = summary.ratio_range(rows, "sampler_sampled")
    assert sampled[0] >= 2
    assert [r["machine"] for r in rows if r["sampler_greedy"] >= 2] == ["amd-epyc-avx512-2c"]
    _assert_quotes(
        flat,
        (
            f"over its {n} machine kinds: the step is faster than TRL's on all {n}"
            f" ({min(steps):.2f}x-{max(steps):.2f}x); the RL iteration is 1.5x or more at both"
            f" betas on {who}.",
            f"2x or more sampled on every kind ({sampled[0]:.2f}x-{sampled[1]:.2f}x); greedy 2x"
            " or more on the avx512 kind only",
        ),
        "docs/benchmarks.md (summary.md)",
    )
    # The latest row's ratios, step ratios and rounds' spans, as benchmarks.md and
    # limits.md quote them.
    b0, b4 = res["results"]["beta=0.0"], res["results"]["beta=0.04"]

    def rounds(r: dict) -> str:
        return f"{min(r['round_speedup_iter']):.2f}x-{max(r['round_speedup_iter']):.2f}x"

    pair = f"{b0['speedup_iter']:.2f}x / {b4['speedup_iter']:.2f}x, its step "
    pair += f"{b0['speedup_step']:.2f}x / {b4['speedup_step']:.2f}x"
    spans = f"span {rounds(b0)} at beta 0 and {rounds(b4)} at beta 0.04"
    # What the reference model's forward adds to each side's step (beta 0.04 over beta 0).
    steps_s = {fw: (b4[fw]["step_s"], b0[fw]["step_s"]) for fw in ("gdpo_jax", "trl")}
    added = {f"{s4 - s0:.2f}" for s4, s0 in steps_s.values()}
    assert len(added) == 1, steps_s  # "adds <x> s to both sides' steps"
    ref = (
        f"forward adds {added.pop()} s to both sides' steps (ours {steps_s['gdpo_jax'][0]:.3f} "
        f"s against {steps_s['gdpo_jax'][1]:.3f}, TRL's {steps_s['trl'][0]:.3f} against "
        f"{steps_s['trl'][1]:.3f})"
    )
    _assert_quotes(
        flat, (pair, spans, ref), "docs/benchmarks.md (machines/amd-epyc-avx512-2c.json)"
    )
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    _assert_quotes(
        limits,
        (pair.replace(", its step", " (its step"), spans),
        "docs/limits.md (machines/amd-epyc-avx512-2c.json)",
    )
    # The token-choice section's top-k on the Sampler: this machine file's bench_sampler.
    run = json.loads(path.read_text())["benchmarks"]["bench_sampler"]["result"]["results"]
    modes = {r["mode"]: r for r in run}
    topk, plain = modes["top-k 50"], modes["sampled"]
    assert (
        f"took {topk['ours_s']:.3f} s in the avx512 kind's machine file, against"
        f" {plain['ours_s']:.3f} s for plain sampling: {topk['speedup']:.2f}x transformers" in flat
    )


def test_rl_rerun_figures_are_the_committed_run() -> None:
    """The avx512 kind's second bench_rl run of 2026-12-07 (beside its machine file's
    row): benchmarks.md and limits.md quote its ratios, rounds and iteration times,
    and the per-cent moves from the row, computed here from both files."""
    import json

    res = json.loads(
        (ROOT / "docs" / "benchmarks" / "rl_rerun_amd-epyc-avx512-2c.json").read_text()
    )
    row = json.loads(
        (ROOT / "docs" / "benchmarks" / "machines" / "amd-epyc-avx512-2c.json").read_text()
    )["benchmarks"]["bench_rl"]["result"]["results"]["beta=0.0"]
    b0, b4 = res["results"]["beta=0.0"], res["results"]["beta=0.04"]

    def span(r: dict) -> str:
        return f"{min(r['round_speedup_iter']):.2f}x-{max(r['round_speedup_iter']):.2f}x"

    # No round of either side had a huge-page fallback or a compaction stall (as quoted).
    for r in (b0, b4):
        for fw in ("gdpo_jax", "trl"):
            assert not any(r[fw]["round_huge_page_fallbacks"] + r[fw]["round_compaction_stalls"])
    ours, trl = b0["gdpo_jax"]["iter_s"], b0["trl"]["iter_s"]
    less = (1 - ours / row["gdpo_jax"]["iter_s"], 1 - trl / row["trl"]["iter_s"])
    flat = " ".join((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").split())
    _assert_quotes(
        flat,
        (
            "](benchmarks/rl_rerun_amd-epyc-avx512-2c.json): "
            f"{b0['speedup_iter']:.2f}x / {b4['speedup_iter']:.2f}x, its step "
            f"{b0['speedup_step']:.2f}x / {b4['speedup_step']:.2f}x (ours {ours:.3f} s per "
            f"beta-0 iteration, TRL's {trl:.3f} s; rounds {span(b0)} and {span(b4)})",
            f"our side taking {100 * less[0]:.0f} % less time per iteration than in the latest "
            f"row and TRL's {100 * less[1]:.0f} % less",
        ),
        "docs/benchmarks.md (docs/benchmarks/rl_rerun_amd-epyc-avx512-2c.json)",
    )
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    _assert_quotes(
        limits,
        (
            f"gave {b0['speedup_iter']:.2f}x / {b4['speedup_iter']:.2f}x, ours {ours:.3f} s per"
            f" beta-0 iteration against the row's {row['gdpo_jax']['iter_s']:.3f} s",
        ),
        "docs/limits.md (docs/benchmarks/rl_rerun_amd-epyc-avx512-2c.json)",
    )


def test_unrolled_layers_smollm2_figures_are_the_committed_run() -> None:
    """benchmarks.md's scan-vs-unrolled figures at SmolLM2-135M's 30 layers are bench_model's
    rows in the avx512 kind's machine file."""
    import json

    path = ROOT / "docs" / "benchmarks" / "machines" / "amd-epyc-avx512-2c.json"
    rows = json.loads(path.read_text())["benchmarks"]["bench_model"]["result"]["results"]
    by = {r["model"]: r for r in rows}
    scan, unrolled = by["smollm2-135m"], by["smollm2-135m+unrolled"]
    flat = " ".join((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").split())
    assert (
        f"{scan['step_s']:.3f} s per step as a scan, {unrolled['step_s']:.3f} s unrolled, best of"
        f" 3; medians {scan['median_step_s']:.3f} and {unrolled['median_step_s']:.3f} s" in flat
    )
    # "remat is slower" on this kind, with the same rows' MFU and best step times.
    remat = by["smollm2-135m+remat"]
    assert remat["mfu"] < scan["mfu"] and remat["step_s"] > scan["step_s"]
    assert (
        f"remat is slower, MFU {remat['mfu']:.2f} against {scan['mfu']:.2f} without it"
        f" ({remat['step_s']:.3f} s against {scan['step_s']:.3f} s per step, best of 3)" in flat
    )


def test_prompt_sharing_section_is_the_committed_run() -> None:
    import json

    from benchmarks import bench_prompt_sharing

    path = ROOT / "docs" / "benchmarks" / "prompt_sharing_amd-epyc-avx512-2c.json"
    res = json.loads(path.read_text())
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert bench_prompt_sharing.table_markdown(res) in doc, (
        "docs/benchmarks.md's prompt sharing table differs from the committed run"
        " (python -m benchmarks.bench_prompt_sharing"
        " --out docs/benchmarks/prompt_sharing_<kind>.json)"
    )
    flat = " ".join(doc.split())
    rows = {r["prompt_width"]: r for r in res["results"]}
    worst = max(r["max_abs_logp_diff"] for r in res["results"])
    assert f"log-probs agree to {worst:.1e}" in flat
    assert f"{rows[16]['step_speedup']:.2f}x for the step at bench_rl-like" in flat
    assert f"{rows[64]['step_speedup']:.2f}x at width 64 and" in flat
    assert f"{rows[256]['step_speedup']:.2f}x at width 256" in flat
    assert rows[256]["step_speedup"] > rows[64]["step_speedup"] > rows[16]["step_speedup"] > 1
    # "above the token ratio at the two wider ones"
    assert all(rows[w]["step_speedup"] > rows[w]["ideal_speedup"] for w in (64, 256))
    assert res["machine"]["glibc_tunables"] == HUGETLB_TUNABLE  # "huge pages on"
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert (
        f"a {rows[16]['step_speedup']:.2f}x faster step at 16-token prompts, "
        f"{rows[256]['step_speedup']:.2f}x at 256" in readme
    )


def test_prompt_sharing_gpu_section_is_the_committed_runs() -> None:
    """The GPU kernel tables and the prose's figures are the committed H200 runs,
    and the parity the prose claims holds in them."""
    import json

    from benchmarks import bench_prompt_sharing as bench

    def load(name: str) -> dict:
        return json.loads((ROOT / "docs" / "benchmarks" / f"{name}.json").read_text())

    res, mb2, mb8 = (load(f"prompt_sharing_h200{s}") for s in ("", "_cudnn_mb2", "_cudnn_mb8"))
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert bench.table_markdown(res) in doc and bench.kernels_markdown([mb2, mb8]) in doc
    flat = " ".join(doc.split())
    r = {(x["prompt_width"], x["attention"]): x for x in res["results"]}
    for w in (512, 2048):  # cuDNN's bf16 error is the einsum path's size, not a wrong key's
        xla_err = max(
            r[w, "xla"]["max_dlogp_vs_f32_per_row"], r[w, "xla"]["max_dlogp_vs_f32_shared"]
        )
        assert r[w, "cudnn"]["max_dlogp_vs_f32_shared"] <= xla_err + 0.01
        assert r[w, "cudnn"]["logp_std_f32"] > 1.0
    x2, c2 = r[2048, "xla"], r[2048, "cudnn"]
    assert f"step {x2['step_s_per_row'] / c2['step_s_shared']:.1f}x faster" in flat
    assert f"{c2['max_dlogp_vs_f32_shared']:.3f} from the f32 reference" in flat
    # mb2 and mb8 are two processes: the prose quotes each one's times, no ratio across them.
    q2 = {x["prompt_width"]: x for x in mb2["results"]}
    q8 = {x["prompt_width"]: x for x in mb8["results"]}
    assert all(q2[w]["step_s_shared"] < q8[w]["step_s_shared"] for w in (512, 2048))

    def t(q: dict, w: int, k: str = "step_s_shared") -> str:
        return f"{q[w][k]:.3f}"

    _assert_quotes(
        flat,
        (
            f"the shared cuDNN step took {t(q2, 512)} s with 2 micro-batches against"
            f" {t(q8, 512)} s with 8 at width 512 ({q2[512]['step_speedup']:.2f}x over per row"
            " within its run",
            f"{t(q2, 2048)} s against {t(q8, 2048)} s at 2048"
            f" ({q2[2048]['step_speedup']:.2f}x over per row",
            f"({t(q2, 512, 'step_s_per_row')} s against {t(q8, 512, 'step_s_per_row')} s, and"
            f" {t(q2, 2048, 'step_s_per_row')} s against {t(q8, 2048, 'step_s_per_row')} s)",
        ),
        "docs/benchmarks.md (prompt_sharing_h200_cudnn_mb*.json)",
    )
    scale = " ".join((ROOT / "docs" / "scale.md").read_text(encoding="utf-8").split())
    assert (
        f"took {t(q2, 512)} and {t(q2, 2048)} s with 2 micro-batches against {t(q8, 512)} and"
        f" {t(q8, 2048)} s with 8" in scale
    )
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    speedup = x2["step_s_per_row"] / c2["step_s_shared"]
    assert f"step at 2048-token prompts is {speedup:.1f}x faster" in readme
    models = " ".join((ROOT / "docs" / "models.md").read_text(encoding="utf-8").split())
    assert f"shared step with it is {speedup:.1f}x as fast as the per-row" in models


def test_kernel_layout_table_is_the_committed_run() -> None:
    import json

    from benchmarks import profile_kernels

    res = json.loads((ROOT / "docs" / "benchmarks" / "profile_kernels.json").read_text())
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert profile_kernels.table_markdown(res) in doc, (
        "docs/benchmarks.md's kernel layout table differs from "
        "docs/benchmarks/profile_kernels.json"
        " (python -m benchmarks.profile_kernels --out docs/benchmarks/profile_kernels.json)"
    )
    # The out-of-cache score dot: its rates and speed-ups in the prose and limits.md,
    # beside the avx512 AMD kind's decode trace that they explain.
    by = {r["slots"]: r for r in res["streamed_scores"]}
    assert all(r["same_scores"] for r in by.values())

    def rate(r: dict, key: str) -> str:
        return f"{r['mb_per_layer'] / r[key]:.0f}"

    a, b = by[128], by[256]
    ops = json.loads(
        (ROOT / "docs" / "benchmarks" / "decode_ops_amd-epyc-avx512-2c.json").read_text()
    )
    qk, pv = (ops["ms_per_step"][f"attention, own slots: {d}"] for d in ("q @ k", "p @ v"))
    step = f"{ops['traced_ms_per_step']:.2f} ms"
    speedups = f"{a['kt_ms'] / a['blocked_ms']:.2f}x and {b['kt_ms'] / b['blocked_ms']:.2f}x"
    flat = " ".join(doc.split())
    _assert_quotes(
        flat,
        (
            f"stream at {rate(a, 'kt_ms')} and {rate(b, 'kt_ms')} GB/s",
            f"at {rate(a, 'blocked_ms')} and {rate(b, 'blocked_ms')} GB/s",
            f"({rate(a, 'pv_ms')} and {rate(b, 'pv_ms')} GB/s): {speedups} faster",
            f"the step ran {step}, and the two own-slot dots split unevenly: "
            f"q @ k {qk:.2f} ms, p @ v {pv:.2f} ms",
        ),
        "docs/benchmarks.md (profile_kernels.json, decode_ops_amd-epyc-avx512-2c.json)",
    )
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    _assert_quotes(
        limits,
        (
            f"took {qk:.2f} ms of a {step.replace(' ms', '')} ms greedy step",
            f"against {pv:.2f} ms for `p @ v`",
            f"({speedups} faster at 128 and 256 slots",
        ),
        "docs/limits.md (profile_kernels.json, decode_ops_amd-epyc-avx512-2c.json)",
    )


def test_matmul_tables_are_the_machine_files_runs() -> None:
    """Every bench_matmul table in benchmarks.md (between its markers, named by machine
    kind) renders that kind's committed machine file, and the README's kernel ratios
    range over the kinds, the Intel Xeon kind's family ratios the low ends."""
    import json

    from benchmarks import bench_matmul

    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    found = re.findall(r"<!-- bench_matmul:(\S+) -->\n(.*?)\n<!-- /bench_matmul -->", doc, re.S)
    assert found, "docs/benchmarks.md shows no bench_matmul table"
    for kind, table in found:
        run = json.loads((ROOT / "docs" / "benchmarks" / "machines" / f"{kind}.json").read_text())
        res = run["benchmarks"]["bench_matmul"]["result"] | {"machine": run["machine"]}
        assert table == bench_matmul.format_table(res), (
            f"the {kind} bench_matmul table differs from machines/{kind}.json "
            "(python -m benchmarks.run_all --out_dir docs/benchmarks)"
        )
    fams = {}
    for path in (ROOT / "docs" / "benchmarks" / "machines").glob("*.json"):
        run = json.loads(path.read_text())
        if "bench_matmul" in run["benchmarks"]:
            fams[path.stem] = run["benchmarks"]["bench_matmul"]["result"]["families"]
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    for family, phrase in (
        ("step", "as fast as PyTorch's at the step's"),
        ("decode", "at the decode's"),
    ):
        ratios = [f[family] for f in fams.values()]
        lo, hi = min(ratios), max(ratios)
        assert min(fams, key=lambda k: fams[k][family]) == "intel-xeon-avx512-2c"
        assert f"{lo:.2f}-{hi:.2f}x {phrase}" in readme, (family, lo, hi)
    assert "the low ends on the Intel Xeon kind" in readme
    # The chained decode rows: benchmarks.md, limits.md and the README quote the Xeon's.
    run = json.loads((ROOT / "docs/benchmarks/machines/intel-xeon-avx512-2c.json").read_text())
    res = run["benchmarks"]["bench_matmul"]["result"]
    chain, glue = res["families"]["decode chain"], res["families"]["decode chain, with glue"]
    rows = {r["family"]: r for r in res["results"]}
    extra = rows["decode chain, with glue"]["torch_ms"] - rows["decode chain"]["torch_ms"]
    flat = " ".join(doc.split())
    _assert_quotes(
        flat,
        (
            f"PyTorch's lead shrinks to {1 / chain:.2f}x ({chain:.2f}x)",
            f"to {1 / glue:.2f}x ({glue:.2f}x): PyTorch's step takes about {extra:.1f} ms more",
        ),
        "docs/benchmarks.md (machines/intel-xeon-avx512-2c.json)",
    )
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    _assert_quotes(
        limits,
        (f"chained: {chain:.2f}x, and {glue:.2f}x with the norms",),
        "docs/limits.md (machines/intel-xeon-avx512-2c.json)",
    )
    # README quotes ranges over kinds: the Xeon's chained-with-glue ratio is the low end.
    assert f"the sampler and `generate()` run them, are {glue:.2f}-" in readme
    assert "the low end the Xeon's" in readme
    glues = {
        k: f["decode chain, with glue"] for k, f in fams.items() if "decode chain, with glue" in f
    }
    assert min(glues, key=glues.get) == "intel-xeon-avx512-2c"
    # ... and the avx512 AMD kind's, where XLA's chain is ahead, with its greedy sampler.
    run = json.loads((ROOT / "docs/benchmarks/machines/amd-epyc-avx512-2c.json").read_text())
    res = run["benchmarks"]["bench_matmul"]["result"]
    rows = {r["family"]: r for r in res["results"]}
    chain, glue = res["families"]["decode chain"], res["families"]["decode chain, with glue"]
    glues = [
        rows["decode chain, with glue"][k] - rows["decode chain"][k] for k in ("torch_ms", "xla_ms")
    ]
    greedy = {
        r["mode"]: r["speedup"] for r in run["benchmarks"]["bench_sampler"]["result"]["results"]
    }
    _assert_quotes(
        flat,
        (
            f"chained XLA's are ahead: {chain:.2f}x, and {glue:.2f}x with their glue",
            f"(PyTorch's glue {glues[0]:.2f} ms a step, XLA's {glues[1]:.2f} ms",
            f"greedy decoding is {greedy['greedy']:.2f}x `generate()` (its bench_sampler of",
        ),
        "docs/benchmarks.md (machines/amd-epyc-avx512-2c.json)",
    )
    # limits.md: the one large gap on that kind, and the other products' range.
    products = {
        (r["family"], r["product"]): r["ratio"]
        for r in res["results"]
        if r["family"] in ("step", "decode")
    }
    gap = products[("decode", "o projection")]
    rest = [v for k, v in products.items() if k != ("decode", "o projection")]
    assert gap == min(products.values()) and gap < min(rest) - 0.3
    _assert_quotes(
        limits,
        (f"large gap ({gap:.2f}x; the other products {min(rest):.2f}-{max(rest):.2f}x)",),
        "docs/limits.md (machines/amd-epyc-avx512-2c.json)",
    )


def test_matmul_chain_differences_are_described_as_committed() -> None:
    """The committed glued chains' max_rel_diff is over the whole timed call (later runs
    record check_steps); the prose quotes it, and the other rows' bound."""
    import json

    glues = {}
    for kind in ("amd-epyc-avx512-2c", "intel-xeon-avx512-2c"):
        run = json.loads((ROOT / "docs/benchmarks/machines" / f"{kind}.json").read_text())
        rows = run["benchmarks"]["bench_matmul"]["result"]["results"]
        glue = next(r for r in rows if r["family"] == "decode chain, with glue")
        assert glue["steps"] == 64
        assert max(r["max_rel_diff"] for r in rows if r is not glue) < 1e-4
        glues[kind] = glue
    xeon, amd = glues["intel-xeon-avx512-2c"], glues["amd-epyc-avx512-2c"]
    # The Xeon's row predates check_steps (the whole call compared); the avx512 kind's
    # latest compares the first CHECK_STEPS steps, where the sides stay close.
    assert "check_steps" not in xeon and amd["check_steps"] == 8 and amd["max_rel_diff"] < 1e-4
    flat = " ".join((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").split())
    _assert_quotes(
        flat,
        (
            "under 1e-4 for every product alone and for the bare chain on both kinds",
            f"The Xeon's glued chain figure, {xeon['max_rel_diff']:.2f}, is over the whole"
            " 64-step call",
            f"where rounding alone keeps them close: {amd['max_rel_diff']:.1e} on the avx512",
        ),
        "docs/benchmarks.md (machines/*.json's bench_matmul)",
    )


def test_intel_xeon_prose_quotes_its_latest_row() -> None:
    """The Intel Xeon section's figures for the kind's latest row: run_all's peak and
    bench_rl's own peaks (each compared at its own size), and bench_model's remat MFU."""
    import json

    run = json.loads((ROOT / "docs/benchmarks/machines/intel-xeon-avx512-2c.json").read_text())
    peak = run["matmul_peak"]
    rl = run["benchmarks"]["bench_rl"]["result"]
    assert peak["n"] == 2048 and rl.get("matmul_peak_n", 1024) == 1024
    by = {r["model"]: r for r in run["benchmarks"]["bench_model"]["result"]["results"]}
    plain, remat = by["smollm2-135m"]["mfu"], by["smollm2-135m+remat"]["mfu"]
    assert remat < plain  # "does not reproduce on this kind either"
    rl_peak = rl["matmul_peak_gflops"]
    flat = " ".join((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").split())
    _assert_quotes(
        flat,
        (
            f"run_all's 2048³ matmul peak {peak['gflops_per_s']:.0f} GFLOP/s",
            f"bench_rl's own 1024³ peaks, XLA's {rl_peak['jax']:.0f} and PyTorch's"
            f" {rl_peak['torch']:.0f} GFLOP/s",
            f"at MFU {plain:.2f} without remat and {remat:.2f} with in the latest machine file",
        ),
        "docs/benchmarks.md (machines/intel-xeon-avx512-2c.json)",
    )


def test_decode_forms_table_is_the_committed_run() -> None:
    import json

    from benchmarks import profile_decode

    res = json.loads((ROOT / "docs" / "benchmarks" / "profile_decode.json").read_text())
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert profile_decode.table_markdown(res) in doc, (
        "docs/benchmarks.md's decode forms table differs from "
        "docs/benchmarks/profile_decode.json"
        " (python -m benchmarks.profile_decode --out docs/benchmarks/profile_decode.json)"
    )
    for m in res["models"].values():  # every form decoded the scan's tokens
        assert all(f["tokens_equal_scan"] for f in m["forms"].values())
    # The prose's ratios (median over the scan's) are this run's.
    flat = " ".join(doc.split())

    def vs_scan(model: str, form: str) -> str:
        forms = res["models"][model]["forms"]
        return f"{forms['scan']['median_s'] / forms[form]['median_s']:.2f}x"

    lo, hi = sorted(vs_scan("bench_sampler's model", f) for f in ("unrolled", "fused"))
    assert f"unrolled forms decode {hi if lo == hi else lo[:-1] + '-' + hi} faster" in flat
    smol = "SmolLM2-135M shapes"
    assert f"the fused form decodes {vs_scan(smol, 'fused')} faster" in flat
    assert f"per-row prompt copies is {vs_scan(smol, 'fused, prompt copied')}" in flat
    assert f"unrolling alone {vs_scan(smol, 'unrolled')}" in flat
    rerun = json.loads((ROOT / "docs/benchmarks/profile_decode_rerun.json").read_text())
    forms = rerun["models"][smol]["forms"]
    again = {f: f"{forms['scan']['median_s'] / r['median_s']:.2f}x" for f, r in forms.items()}
    assert (
        f"there the fused form was {again['fused']}, unrolling alone {again['unrolled']} and "
        f"the prompt copies {again['fused, prompt copied']}"
    ) in flat
    both = (res, rerun)
    assert all(
        r["models"][m]["forms"][f]["median_s"] < r["models"][m]["forms"]["scan"]["median_s"]
        for r in both
        for m in r["models"]
        for f in ("unrolled", "fused")
    ), "the prose says every unrolled form was ahead of the scan in both runs"
    # The trace table and its prose (the 8 largest operation kinds of each form).
    assert profile_decode.trace_table_markdown(res) in doc
    ops = res["models"]["bench_sampler's model"]["op_ms_per_step"]
    scan, fused = ops["scan"], ops["fused"]
    copies = scan["dynamic-slice_bitcast_fusion"]
    assert f"{copies:.1f} of the scan's {sum(scan.values()):.1f} ms per step" in flat
    assert f"gone in the fused form ({sum(fused.values()):.1f} ms)" in flat
    assert f"long (`ynn_fusion` {fused['ynn_fusion']:.1f} against {scan['ynn_fusion']:.1f}" in flat


def test_decode_growth_table_is_the_committed_run() -> None:
    import json

    from benchmarks import bench_decode_growth

    res = json.loads((ROOT / "docs" / "benchmarks" / "decode_growth.json").read_text())
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert bench_decode_growth.table_markdown(res) in doc, (
        "docs/benchmarks.md's decode growth table differs from docs/benchmarks/"
        "decode_growth.json (python -m benchmarks.bench_decode_growth --out <it>)"
    )
    forms = res["forms"]
    assert all(r["tokens_equal_copy"] for f in forms.values() for r in f.values())
    ratio = {f: forms[f]["prefix"]["median_s"] / forms[f]["copy"]["median_s"] for f in forms}
    flat = " ".join(doc.split())
    assert f"the fused form takes {ratio['fused']:.2f}x the time" in flat
    assert f"the scan {ratio['scan']:.2f}x" in flat


_WORDS = dict(enumerate(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight"]))


def test_longtail_table_is_the_committed_runs() -> None:
    import json

    from benchmarks import bench_longtail

    paths = sorted((ROOT / "docs" / "benchmarks").glob("longtail_*.json"))
    runs = [json.loads(p.read_text()) for p in paths]
    assert {r["quick"] for r in runs} == {True, False}
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert bench_longtail.table_markdown(runs) in doc, (
        "docs/benchmarks.md's long-tail table differs from docs/benchmarks/longtail_*.json "
        "(python -m benchmarks.bench_longtail [--quick] --out "
        "docs/benchmarks/longtail_<size>_<n>.json)"
    )
    # The prose, the limits and the README quote these runs' ranges.
    ratio = {
        q: [r["measured"]["useful_throughput_ratio"] for r in runs if r["quick"] == q]
        for q in (False, True)
    }
    full, quick = (f"{min(ratio[q]):.2f}-{max(ratio[q]):.2f}x" for q in (False, True))
    step = [
        r["measured"]["static"]["decoded_tokens_per_s"]
        / r["measured"]["continuous"]["decoded_tokens_per_s"]
        for r in runs
    ]
    met = sum(x >= 2.0 for xs in ratio.values() for x in xs)
    flat = " ".join(doc.split())
    _assert_quotes(
        flat,
        (
            f"Useful throughput is {full} the static calls' at the full size (cap 512) and {quick}",
            f"is met in {_WORDS[met]} runs of {_WORDS[len(runs)]}",
            f"decoded tok/s columns: {min(step):.2f}-{max(step):.2f}x",
            *(f"by {2.0 - x:.2f} in" for xs in ratio.values() for x in xs if x < 2.0),
        ),
        "docs/benchmarks.md's long-tail prose",
    )
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert (
        f"useful throughput {full} and {quick} theirs ({_WORDS[len(runs)]} committed runs" in readme
    )
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    assert f"met in {_WORDS[met]} of {_WORDS[len(runs)]} committed runs" in limits
    assert f"({full} at the full size, {quick} at the quick one; [benchmarks]" in limits


def test_longtail_reads_table_and_prose_are_the_counts() -> None:
    """docs/benchmarks.md's KV-read table is `bench_longtail --reads` (pure counts),
    and its prose quotes the full size's ratios from the same counts."""
    from benchmarks import bench_longtail
    from gdpo_jax.sampling.prompt_slots import suggested_prompt_slots

    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    table = bench_longtail.reads_table_markdown()
    assert table in doc, (
        "docs/benchmarks.md's KV-read table: python -m benchmarks.bench_longtail --reads"
    )
    slots, cap = bench_longtail.SIZES["full"]
    lengths = bench_longtail.longtail_lengths(8 * slots, median=24.0, sigma=1.0, cap=cap)
    short = bench_longtail.kv_slot_reads(lengths, slots, 24, cap)
    long = bench_longtail.kv_slot_reads(lengths, slots, 2048, cap, group=8)
    assert "With W = 24 shared" in doc and suggested_prompt_slots(slots, 8) == 24
    prose = " ".join(doc.split("<!-- /longtail-reads -->", 1)[1].split("\n\n")[1].split())

    steps_saved = bench_longtail.waste_table(lengths, slots)["useful_throughput_gain"]

    def x(r: dict, k: str) -> str:
        return f"{r[k] / r['ragged']:.2f}x"

    for figure in (
        f"reads {x(short, 'continuous')} the slots its rows need",
        f"(static calls {x(short, 'static')})",
        f"reads {x(long, 'static')} the need, and continuous batching",
        f"every lane, {x(long, 'continuous')}: more than the static calls",
        f"in {steps_saved:.2f}x fewer steps",
        "(`sampling.continuous_prompt_slots`, 3 x lanes / G;",
        f"it reads {x(long, 'continuous_shared')}, in "
        f"{long['continuous_shared_steps'] / long['continuous_steps']:.2f}x the copies' steps",
    ):
        assert figure in prose, f"docs/benchmarks.md's KV-read prose should say {figure!r}"


def test_attention_section_is_the_committed_h200_run() -> None:
    """docs/benchmarks.md's GPU attention table is attention_h200.json's rendering, and
    the prose's claims hold in that run: cuDNN at parity (log-probs no further from
    f32 than the einsum path's bf16), 1.8x / 3.4x faster, ~12 GiB, same greedy tokens."""
    import json

    from benchmarks import bench_attention

    res = json.loads((ROOT / "docs" / "benchmarks" / "attention_h200.json").read_text())
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert bench_attention.format_table(res) in doc, (
        "docs/benchmarks.md's attention table differs from docs/benchmarks/attention_h200.json"
        " (render it with benchmarks.bench_attention.format_table)"
    )
    assert res["backend"] == "gpu" and "H200" in res["device"]
    by = {(r["seq"], r["attention"], r["dtype"]): r for r in res["results"]}
    for seq, speedup in ((1024, "1.8x"), (4096, "3.4x")):
        xla, cudnn = by[(seq, "xla", "bfloat16")], by[(seq, "cudnn", "bfloat16")]
        assert cudnn["max_dlogp_vs_f32"] <= xla["max_dlogp_vs_f32"]
        assert by[(seq, "xla", "float32")]["matmul_precision"] == "highest"
        assert f"{cudnn['max_dlogp_vs_f32']:.3f} vs {xla['max_dlogp_vs_f32']:.3f}" in doc
        assert f"{xla['fwd_bwd_ms'] / cudnn['fwd_bwd_ms']:.1f}x" in doc
        assert f"{speedup} ({seq} tokens)" in readme or f"{speedup} ({seq})" in readme
        assert f"{xla['fwd_bwd_ms'] / cudnn['fwd_bwd_ms']:.1f}x" == speedup
        assert round(cudnn["temp_gib"]) == 12
    assert all(r["rows_same_tokens_as_xla"] == 1.0 for r in res["sampling"])


def test_gpu_sampler_section_is_the_committed_runs() -> None:
    """docs/benchmarks.md's GPU sampler tables render sampler_h200_*.json, and the prose
    and README hold there: 7.1-7.3x (SmolLM2) and 12-19x (tiny) under full f32 with every
    greedy row identical, 62 % identical under TF32."""
    import json

    from benchmarks import bench_sampler

    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    runs = {
        n: json.loads((ROOT / "docs" / "benchmarks" / f"sampler_h200_{n}.json").read_text())
        for n in ("tiny_highest", "smollm2_highest", "tiny_default")
    }
    for n, res in runs.items():
        assert bench_sampler.format_table(res) in doc, f"sampler_h200_{n}.json's table differs"
        assert res["hf_device"] == "cuda" and res["machine"]["device_kind"] == "NVIDIA H200"

    def span(res: dict) -> str:
        s = sorted(r["speedup"] for r in res["results"])
        return f"{s[0]:.1f}-{s[-1]:.1f}x" if s[-1] < 10 else f"{s[0]:.0f}-{s[-1]:.0f}x"

    smol, tiny = span(runs["smollm2_highest"]), span(runs["tiny_highest"])
    for text in (doc, readme):
        flat = " ".join(text.split())
        assert f"{smol} " in flat and f"SmolLM2-135M's shapes and {tiny}" in flat
    assert runs["smollm2_highest"]["greedy_rows_identical_to_hf"] == 1.0
    assert runs["tiny_highest"]["greedy_rows_identical_to_hf"] == 1.0
    assert f"only {runs['tiny_default']['greedy_rows_identical_to_hf']:.0%}" in doc.replace(
        " %", "%"
    )


def _reward_cost_run(bench: str, prefix: str) -> tuple[dict, str]:
    """(the committed avx512 run of benchmarks.<bench>, tasks-and-rewards.md flattened),
    after checking that the doc renders the run's tables (format_table)."""
    import importlib
    import json

    module = importlib.import_module(f"benchmarks.{bench}")
    path = ROOT / "docs" / "benchmarks" / f"{prefix}_amd-epyc-avx512-2c.json"
    res = json.loads(path.read_text())
    doc = (ROOT / "docs" / "tasks-and-rewards.md").read_text(encoding="utf-8")
    assert module.format_table(res) in doc, (
        f"docs/tasks-and-rewards.md's {bench} tables differ from the committed run"
        f" (python -m benchmarks.{bench} --out docs/benchmarks/{prefix}_<kind>.json)"
    )
    return res, " ".join(doc.split())


def test_sandbox_cost_section_is_the_committed_run() -> None:
    """tasks-and-rewards.md's Cost section renders the committed bench_sandbox run, and
    its prose's figures are that run's."""
    res, flat = _reward_cost_run("bench_sandbox", "sandbox")
    plain = [r for r in res["programs"] if r["program"] == "plain"]
    one = sorted(r["program_1_case_ms"] for r in plain)
    over = sorted(r["over_bare_interpreter_ms"] for r in plain)
    case = sorted(r["per_extra_case_ms"] for r in plain)
    assert f"about {one[0]:.0f}-{one[-1]:.0f} ms" in flat
    lo, hi = f"{over[0]:.0f}", f"{over[-1]:.0f}"
    assert f"{lo if lo == hi else f'{lo}-{hi}'} ms over a bare interpreter start" in flat
    assert f"test case {case[0]:.1f}-{case[-1]:.1f} ms" in flat
    (everything,) = [r for r in res["programs"] if r["program"] == "all preloads"]
    (same_mode,) = [r for r in plain if r["mode"] == everything["mode"]]
    extra = everything["program_1_case_ms"] - same_mode["program_1_case_ms"]
    assert f"about {extra:.0f} ms more" in flat
    per_s = {r["workers"]: r["completions_per_s"] for r in res["reward"]}
    assert f"one worker thread the reward scores {per_s[1]} completions" in flat
    assert f"with 2 workers {per_s[2]}" in flat
    assert f"with 4 workers {per_s[4]}" in flat


def test_math_cost_section_is_the_committed_run() -> None:
    """tasks-and-rewards.md's math-verify cost section renders the committed bench_math
    run, and its prose's figures are that run's."""
    res, flat = _reward_cost_run("bench_math", "math")
    sym = [r for r in res["comparisons"] if r["path"] == "sympy"]
    med = sorted(r["median_ms"] for r in sym)
    assert f"sympy costs {med[0]:.1f}-{med[-1]:.1f} ms" in flat
    slow = max(sym, key=lambda r: r["max_ms"])
    assert f"{slow['max_ms']:.0f} ms for the {slow['kind']}" in flat
    assert f"A helper starts in {res['helper_start']['median_s']} s" in flat
    p = res["pathological"]
    assert f"({p['to_timeout_s']} s at 1 s) plus {p['next_comparison_s']} s" in flat
    rw = {r["workers"]: r for r in res["reward"]}
    assert f"scores {rw[1]['warm_completions_per_s']} completions per second" in flat
    assert f"and {rw[4]['warm_completions_per_s']} with four" in flat
    assert f"about {64 * rw[1]['warm_ms_per_completion'] / 1000:.2f} s with one worker" in flat


def test_gpu_rl_section_is_the_committed_runs() -> None:
    """benchmarks.md's "On a GPU" tables render rl_h200_*.json, and the prose and README
    ranges are those runs' (TRL on CUDA, full f32 in the run they quote)."""
    import json

    from benchmarks import bench_rl

    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    runs = {
        n: json.loads((ROOT / "docs" / "benchmarks" / f"rl_h200_{n}.json").read_text())
        for n in ("highest", "default")
    }
    for n, res in runs.items():
        assert bench_rl.table(res) in doc, f"rl_h200_{n}.json's table differs"
        assert res["jax_backend"] == "gpu" and res["trl_device"] == "cuda"
        assert res["matmul_precision"] == n
    hi = runs["highest"]["results"].values()

    def span(key: str) -> str:
        s = sorted(r[key] for r in hi)
        return f"{s[0]:.1f}-{s[1]:.1f}x"

    flat, flat_readme = " ".join(doc.split()), " ".join(readme.split())
    assert f"An RL iteration is {span('speedup_iter')} TRL's" in flat
    assert f"sampling {span('speedup_sample')} and the step {span('speedup_step')}" in flat
    assert f"an RL iteration {span('speedup_iter')} as fast as TRL's" in flat_readme


def test_gpu_longtail_table_is_the_committed_runs() -> None:
    """The H200 long-tail table renders gpu_longtail_h200_*.json (labelled by file), and
    its prose holds: 2.54-2.62x, identical rows exactly under full f32 precision."""
    import json

    from benchmarks import bench_longtail

    names = [
        "gpu_longtail_h200_quick_default",
        "gpu_longtail_h200_quick_highest",
        "gpu_longtail_h200_full_highest",
    ]
    runs = [json.loads((ROOT / "docs" / "benchmarks" / f"{n}.json").read_text()) for n in names]
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert bench_longtail.table_markdown(runs, labels=names) in doc
    ratios = sorted(r["measured"]["useful_throughput_ratio"] for r in runs)
    assert f"{ratios[0]:.2f}-{ratios[-1]:.2f}x" in doc
    same = [r["measured"]["greedy_rows_identical"] for r in runs]
    assert same == [False, True, True]
    frac = runs[0]["measured"]["greedy_rows_identical_frac"]
    rows = runs[0]["counts"]["rows"]
    assert f"{round((1 - frac) * rows)} of the {rows} rows" in doc


def test_smollm2_results_table_is_the_committed_run() -> None:
    """docs/results.md's SmolLM2 table is experiments.smollm2_demo's summary of the
    committed run records (re-derived here from docs/results/smollm2_toolcall/run/)."""
    import json

    from experiments import smollm2_demo

    d = ROOT / "docs" / "results" / "smollm2_toolcall"
    rows = [json.loads(x) for x in (d / "run" / "metrics.jsonl").read_text().splitlines() if x]
    eval0 = json.loads((d / "run" / "eval_step0.json").read_text())
    wall_s = json.loads((d / "run" / "wall_s.json").read_text())
    machine = json.loads((d / "summary.json").read_text())["machine"]
    table = smollm2_demo.render(smollm2_demo.summarize(rows, eval0, wall_s), machine)
    assert (d / "summary.md").read_text().strip() == table
    assert table in (ROOT / "docs" / "results.md").read_text(encoding="utf-8")


def test_prompt_slots_table_and_prose_are_the_committed_run() -> None:
    """docs/benchmarks.md's shared-prompt-slots table renders the committed run, and
    the figures its prose and sampling.md / limits.md quote are computed from it and
    from the same command's run without huge pages (decode seconds: a call's less the
    fixed part, every row's budget at 1 token)."""
    import json

    from benchmarks import bench_prompt_slots

    def load(suffix: str) -> dict:
        path = f"prompt_slots_amd-epyc-avx512-2c{suffix}.json"
        return json.loads((ROOT / "docs" / "benchmarks" / path).read_text())

    res, plain = load(""), load("_no_huge_pages")
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert bench_prompt_slots.table_markdown(res) in doc, (
        "docs/benchmarks.md's prompt-slots table: python -m benchmarks.bench_prompt_slots "
        "--repeats 3 --out docs/benchmarks/prompt_slots_amd-epyc-avx512-2c.json"
    )
    assert res["machine"]["glibc_tunables"] == HUGETLB_TUNABLE
    assert plain["machine"]["glibc_tunables"] == ""  # GDPO_JAX_NO_RELAUNCH=1

    def figures(r: dict) -> tuple[dict, dict, dict]:
        runs = {x["prompt_slots"]: x for x in r["runs"]}
        assert sorted(runs) == [0, 4, 6, 8]
        assert all(x["greedy_rows_identical"] for x in runs.values())
        dec = {w: x["best_s"] - r["fixed_s"] for w, x in runs.items()}
        call = {w: runs[0]["best_s"] / x["best_s"] for w, x in runs.items()}
        return runs, dec, call

    runs, dec, call = figures(res)
    _, pdec, pcall = figures(plain)
    prose = " ".join(doc.split("<!-- /prompt-slots -->", 1)[1].split("\n## ", 1)[0].split())
    _assert_quotes(
        prose,
        (
            f"{res['fixed_s']:.2f} s of prefilling",
            f"W = 4 took {dec[4]:.2f} s against the copies' {dec[0]:.2f} s",
            f"({dec[0] / dec[4]:.2f}x as fast; the whole call {call[4]:.2f}x)",
            f"({runs[4]['decode_steps'] / runs[0]['decode_steps']:.2f}x the steps)",
            f"reading {runs[0]['kv_slot_reads'] / runs[4]['kv_slot_reads']:.2f}x fewer KV slots",
            f"took {1 / call[6]:.2f}x and {1 / call[8]:.2f}x the copies' time",
            f"decoded the copies in {pdec[0]:.2f} s and W = 4 in {pdec[4]:.2f} s",
            f"({pdec[0] / pdec[4]:.2f}x faster; the whole call {pcall[4]:.2f}x)",
            f"W = 6 and 8 at {1 / pcall[6]:.2f}x and {1 / pcall[8]:.2f}x the copies' time",
        ),
        "docs/benchmarks.md's prompt-slots prose",
    )
    # "the copies won" / "So the copies stay the default on CPU": every W slower with huge pages.
    assert all(call[w] < 1 for w in (4, 6, 8))
    sampling = " ".join((ROOT / "docs" / "sampling.md").read_text(encoding="utf-8").split())
    assert f"lanes decoded at {dec[0] / dec[4]:.2f}x the copies' speed" in sampling
    assert f"without them W = 4 decoded {pdec[0] / pdec[4]:.2f}x faster" in sampling
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    shared = [call[w] for w in (4, 6, 8)]
    assert f"were {min(shared):.2f}-{max(shared):.2f}x as fast as the copies" in limits
    plain_shared = [pcall[w] for w in (4, 6, 8)]
    assert f"({min(plain_shared):.2f}-{max(plain_shared):.2f}x as fast without them)" in limits
    # The H200 run of the same command (the tiny model).
    gpu = json.loads((ROOT / "docs" / "benchmarks" / "prompt_slots_h200.json").read_text())
    assert gpu["machine"]["device_kind"] == "NVIDIA H200"
    g_runs, _, g_call = figures(gpu)
    secs = [x["best_s"] for x in g_runs.values()]
    _assert_quotes(
        prose,
        (
            f"a call took {min(secs):.3f}-{max(secs):.3f} s, {gpu['fixed_s']:.3f} s of it",
            f"W = 4, 6 and 8 ran at {g_call[4]:.2f}x, {g_call[6]:.2f}x and {g_call[8]:.2f}x",
            f"the {runs[0]['kv_slot_reads'] / runs[4]['kv_slot_reads']:.1f}x fewer KV slots",
        ),
        "docs/benchmarks.md's prompt-slots prose (H200)",
    )
    g_shared = [g_call[w] for w in (4, 6, 8)]
    assert f"one H200 at the tiny benchmark model's size ({min(g_shared):.2f}-" in limits
    assert f"-{max(g_shared):.2f}x; not measured" in limits
    g_range = f"{min(g_shared):.2f}-{max(g_shared):.2f}x"
    assert f"at the tiny benchmark model's size, {g_range} (not measured" in limits
    assert f"W = 4-8 ran at {g_range} the copies' speed" in sampling


def _speedup_span(rows: list[dict], pred) -> str:
    """The `speedup` range of the rows `pred` keeps as the docs quote it: "{min}x-{max}x",
    or "{x}x" when they are one figure."""
    x = [r["speedup"] for r in rows if pred(r)]
    return f"{min(x):.2f}x" if min(x) == max(x) else f"{min(x):.2f}x-{max(x):.2f}x"


def test_token_choice_table_and_prose_are_the_committed_run() -> None:
    """docs/benchmarks.md's token-choice table renders the committed run, and the
    ranges its prose quotes are that table's."""
    import json

    from benchmarks import bench_token_choice

    res = json.loads(
        (ROOT / "docs" / "benchmarks" / "token_choice_amd-epyc-avx512-2c.json").read_text()
    )
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    table = bench_token_choice.format_table(res).split("\n\n", 1)[1]
    assert table in doc, (
        "docs/benchmarks.md's token-choice table: python -m benchmarks.bench_token_choice "
        "--out docs/benchmarks/token_choice_amd-epyc-avx512-2c.json"
    )
    rows = res["results"]

    def span(pred) -> str:
        return _speedup_span(rows, pred)

    def top_p(logits: str | None, big: bool) -> str:
        return span(
            lambda r: (
                r["mode"] == "top-p 0.95"
                and (r["vocab"] > 2048) == big
                and logits in (None, r["logits"])
            )
        )

    flat = " ".join(doc.split("## Choosing a token", 1)[1].split("\n## ", 1)[0].split())
    _assert_quotes(
        flat,
        (
            f"top-k 50 {span(lambda r: r['mode'] == 'top-k 50')} faster",
            f"plain sampling {span(lambda r: r['mode'] == 'sampled')}",
            f"peaked logits {top_p('peaked', True)}",
            f"mixed ones {top_p('mixed', True)}",
            f"flat ones {top_p('flat', True)}",
            f"at 2,048 tokens {top_p(None, False)}",
        ),
        "docs/benchmarks.md's token-choice prose",
    )
    assert res["machine"]["glibc_tunables"] == HUGETLB_TUNABLE  # "huge pages on"
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    assert f"save ({top_p(None, False)} on CPU" in limits


def test_top_k_blocks_section_is_the_committed_run() -> None:
    """benchmarks.md's "Top-k through blocks" tables render the committed run, and every
    range its prose quotes is that run's (the threshold's too)."""
    import json

    from benchmarks import bench_top_k
    from gdpo_jax.sampling import topk

    res = json.loads((ROOT / "docs" / "benchmarks" / "top_k_amd-epyc-avx2-2c.json").read_text())
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = doc.split("### Top-k through blocks", 1)[1].split("\n#", 1)[0]
    assert bench_top_k.format_table(res).split("\n\n", 1)[1] in section, (
        "python -m benchmarks.bench_top_k --out docs/benchmarks/top_k_amd-epyc-avx2-2c.json"
    )

    sel, smp = res["results"], res["sampling"]
    big = topk.BLOCKS_MIN_VOCAB
    _assert_quotes(
        " ".join(section.split()),
        (
            f"from {big:,} tokens up the blocks were "
            f"{_speedup_span(sel, lambda r: r['vocab'] >= big)}",
            f"below {big:,} the library keeps one TopK",
            f"at 2,048 tokens {_speedup_span(sel, lambda r: r['vocab'] == 2048)}",
            f"at 4,096 {_speedup_span(sel, lambda r: r['vocab'] == 4096)}",
            f"top-k 50 {_speedup_span(smp, lambda r: r['mode'] == 'top-k 50')}",
            f"({_speedup_span(smp, lambda r: r['mode'] == 'top-k 50' and r['vocab'] >= 49152)}"
            " at 49,152",
            f"top-p 0.95 {_speedup_span(smp, lambda r: r['mode'] == 'top-p 0.95')}",
        ),
        "docs/benchmarks.md's top-k blocks prose",
    )
    assert all(r["same"] for r in sel) and all(r["same_tokens"] == 1 for r in smp)
    assert {r["chosen"] for r in sel if r["vocab"] >= big} == {"blocks"}
    assert res["machine"]["glibc_tunables"] == HUGETLB_TUNABLE


def test_import_section_is_the_committed_runs() -> None:
    """benchmarks.md's "Starting a process" tables render the two committed runs (before
    and after), and every figure its prose quotes is theirs or the eager-models run's."""
    import json

    from benchmarks import profile_import

    runs = {}
    for name in ("before", "after"):
        suffix = "_before" if name == "before" else ""
        path = ROOT / "docs" / "benchmarks" / f"import_amd-epyc-avx2-2c{suffix}.json"
        runs[name] = json.loads(path.read_text())
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = doc.split("## Starting a process", 1)[1].split("\n## ", 1)[0]
    for res in runs.values():
        assert profile_import.format_table(res).split("\n\n", 1)[1] in section, (
            "python -m benchmarks.profile_import --out docs/benchmarks/import_<kind>.json"
        )
    b, a = runs["before"], runs["after"]
    assert (b["ml_dtypes"], a["ml_dtypes"]) == ("0.7.0", "0.6.0")
    row = {name: {r["target"]: r["median_s"] for r in res["rows"]} for name, res in runs.items()}
    cli = "train CLI's refusal, re-executed"
    _assert_quotes(
        " ".join(section.split()),
        (
            f"spent {b['top_self_ms'][0]['self_ms']:.0f} ms of its own",
            f"`import ml_dtypes` went from {row['before']['ml_dtypes']} to "
            f"{row['after']['ml_dtypes']} s",
            f"`import jax` from {row['before']['jax']} to {row['after']['jax']} s",
            f"went from {b['relaunch_cost_s']} s to {a['relaunch_cost_s']} s",
            f"took {row['before'][cli]} s and takes {row['after'][cli]} s",
            f"the trainer's import {row['before']['trainer']} and {row['after']['trainer']} s",
        ),
        "docs/benchmarks.md's import prose",
    )
    assert b["top_self_ms"][0]["module"] == "ml_dtypes._ml_dtypes_ext"
    assert "ml_dtypes._ml_dtypes_ext" not in {r["module"] for r in a["top_self_ms"]}
    # The early re-exec: within noise of none after, more than a second before.
    assert b["relaunch_cost_s"] > 1.0 and abs(a["relaunch_cost_s"]) < 0.25
    # The model field's refusal, with the model's and sampler's packages imported eagerly
    # (commit 03d2644) and on first use: flax and optax were about half a second of it.
    eager_path = ROOT / "docs" / "benchmarks" / "import_amd-epyc-avx2-2c_eager_models.json"
    row["eager"] = {r["target"]: r["median_s"] for r in json.loads(eager_path.read_text())["rows"]}
    late = "train CLI's refusal of a model field, re-executed"
    _assert_quotes(
        " ".join(section.split()),
        (
            f"timed the model field's refusal at {row['eager'][late]} s against "
            f"{row['eager'][cli]} s for the refusal without a workdir; after, "
            f"{row['after'][late]} s against {row['after'][cli]} s",
        ),
        "docs/benchmarks.md's import prose",
    )
    assert row["eager"][late] - row["eager"][cli] > 0.3
    assert row["after"][late] - row["after"][cli] < 0.2


def test_bisect_chunks_section_is_the_committed_run() -> None:
    """benchmarks.md's "Bisecting one or two wide rows" table renders the committed run,
    and its prose's ranges are that run's."""
    import json

    from benchmarks import probe_bisect_chunks
    from gdpo_jax.sampling import filters

    res = json.loads(
        (ROOT / "docs" / "benchmarks" / "bisect_chunks_amd-epyc-avx2-2c.json").read_text()
    )
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = doc.split("### Bisecting one or two wide rows", 1)[1].split("\n#", 1)[0]
    assert probe_bisect_chunks.format_table(res).split("\n\n", 1)[1] in section, (
        "python -m benchmarks.probe_bisect_chunks "
        "--out docs/benchmarks/bisect_chunks_amd-epyc-avx2-2c.json"
    )
    rows = res["results"]

    def span(pred) -> str:
        return _speedup_span(rows, pred)

    def wide(r: dict) -> bool:  # mixed logits at the large vocabularies
        return r["logits"] == "mixed" and r["vocab"] > 2048

    _assert_quotes(
        " ".join(section.split()),
        (
            f"smaller chunks were {span(wide)} faster",
            f"either no row or most rows bisect, {span(lambda r: not wide(r))}",
            f"`BISECT_CHUNKS` = ({', '.join(map(str, filters.BISECT_CHUNKS))})",
        ),
        "docs/benchmarks.md's bisection-chunks prose",
    )
    assert res["chunks"] == list(filters.BISECT_CHUNKS)
    assert all(r["same_tokens"] == 1 for r in rows)
    assert res["machine"]["glibc_tunables"] == HUGETLB_TUNABLE


def test_science_quotes_the_studies_format_shares() -> None:
    # science.md's "Reading it" quotes GRPO's and GDPO's mean format share in two
    # studies; they are the committed results' `share:` rows (columns: grpo,
    # grpo_no_std, gdpo).
    science = " ".join((ROOT / "docs" / "science.md").read_text(encoding="utf-8").split())
    got = {}
    for study, reward in (("format_cold", "toolcall_format"), ("format_cold_toy", "toy_format")):
        text = (ROOT / "docs" / "results" / study / "results.md").read_text(encoding="utf-8")
        row = re.search(rf"^\| share:{reward} \|(.*)$", text, re.M).group(1).split("|")
        got[study] = [cell.split()[0] for cell in row[:3]]
    grpo = f"{got['format_cold'][0]} (`format_cold`) and {got['format_cold_toy'][0]}"
    gdpo = f"GDPO's at {got['format_cold'][2]} and {got['format_cold_toy'][2]}"
    _assert_quotes(science, (grpo, gdpo), "docs/science.md's format shares")


def test_gpu_token_choice_table_and_prose_are_the_committed_runs() -> None:
    """docs/benchmarks.md's GPU token-choice table renders the committed H200 run of
    the current form, and the ranges its prose and limits.md quote are the three runs'."""
    import json

    from benchmarks import bench_token_choice

    def load(name: str) -> dict:
        return json.loads((ROOT / "docs" / "benchmarks" / f"{name}.json").read_text())

    now, gathered, c16 = (load(f"token_choice_h200{x}") for x in ("", "_gathered", "_candidates16"))
    assert {r["machine"]["device_kind"] for r in (now, gathered, c16)} == {"NVIDIA H200"}
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = doc.split("### Choosing a token on a GPU", 1)[1].split("\n## ", 1)[0]
    assert bench_token_choice.format_table(now).split("\n\n", 1)[1] in section

    def rows(res: dict, mode: str, big: bool | None = None) -> list[dict]:
        return [r for r in res["results"] if r["mode"] == mode and big in (None, r["vocab"] > 2048)]

    def span(res: dict, mode: str) -> str:
        x = [r["speedup"] for r in rows(res, mode)]
        return f"{min(x):.2f}x-{max(x):.2f}x"

    def ms(res: dict, mode: str) -> str:
        x = [r["ours_ms"] for r in rows(res, mode, big=True)]
        return f"{min(x):.2f}-{max(x):.2f} ms"

    flat_gathered = {(r["vocab"], r["logits"]): r for r in rows(gathered, "top-p 0.95")}
    worst = flat_gathered[(49152, "flat")]
    slow = [1 / r["speedup"] for r in rows(gathered, "top-p 0.95")]
    _assert_quotes(
        " ".join(section.split()),
        (
            f"ran at {span(gathered, 'top-p 0.95')} the reference's speed",
            f"{worst['ours_ms']:.1f} ms per choice at `[64, 49152]` on flat",
            f"fixed 32 halvings of every row take {worst['reference_ms']:.2f} ms",
            f"it ran at {span(c16, 'top-p 0.95')}",
            f"Top-p 0.95 runs at {span(now, 'top-p 0.95')} the reference",
            f"{ms(now, 'top-p 0.95')} per choice at the two large vocabularies",
            f"Plain sampling: {span(now, 'sampled')}",
            f"Top-k 50: {span(now, 'top-k 50')}",
        ),
        "docs/benchmarks.md's GPU token-choice prose",
    )
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    _assert_quotes(
        limits,
        (
            f"32 fixed steps, {ms(now, 'top-p 0.95')} per choice",
            f"had been {min(slow):.1f}-{max(slow):.0f}x slower",
            f"at every step (XLA's TopK kernel covers k up to 16): {ms(now, 'top-k 50')}",
        ),
        "docs/limits.md's GPU top-p",
    )


def test_cpu_collectives_cache_table_and_prose_are_the_committed_runs() -> None:
    """docs/limits.md's table of loaded multi-device XLA:CPU programs renders the
    committed probe runs, and what its prose concludes holds in them."""
    import json

    from benchmarks import probe_cpu_collectives_cache as probe

    paths = sorted((ROOT / "docs" / "benchmarks").glob("cpu_collectives_cache_*.json"))
    rows = [r for p in paths for r in json.loads(p.read_text())["results"]]
    limits = (ROOT / "docs" / "limits.md").read_text(encoding="utf-8")
    flat = "\n".join(line.strip() for line in limits.splitlines())
    assert rows and probe.format_table(rows) in flat, (
        "docs/limits.md's table: python -m benchmarks.probe_cpu_collectives_cache "
        "--out docs/benchmarks/cpu_collectives_cache_<machine kind>.json"
    )
    by = {s: [r for r in rows if r["setting"] == s] for s in probe.SETTINGS}
    assert all(r["fresh_passed"] for r in rows)
    # "With the concurrency-optimized scheduler off, the loaded programs ran every time."
    assert by["ordered scheduler"] and not any(r["loaded_aborted"] for r in by["ordered scheduler"])
    # The default scheduler is why the cache stays off by default.
    assert any(r["loaded_aborted"] for r in by["default scheduler"])
    # "Longer collective timeouts only make the abort later."
    timeouts = by["300 s collective timeouts"]
    assert timeouts and all(r["loaded_aborted"] == r["loaded_runs"] for r in timeouts)
    assert "Longer collective timeouts only make the abort later" in " ".join(limits.split())


def test_cpu_collectives_pool_table_and_prose_are_the_committed_run() -> None:
    """docs/limits.md's table of XLA:CPU pool sizes renders the committed probe runs,
    and what it concludes holds in them: XLA's pool (a thread per device) deadlocked,
    every larger pool, gdpo_jax's among them, finished every run."""
    import json

    from benchmarks import probe_cpu_collectives_pool as probe
    from gdpo_jax.xla_cpu import POOL_THREADS_PER_DEVICE

    paths = sorted((ROOT / "docs" / "benchmarks").glob("cpu_collectives_pool_*.json"))
    runs = [json.loads(p.read_text()) for p in paths]
    rows = [r for run in runs for r in run["results"]]
    limits = (ROOT / "docs" / "limits.md").read_text(encoding="utf-8")
    flat = "\n".join(line.strip() for line in limits.splitlines())
    assert rows and probe.format_table(rows) in flat, (
        "docs/limits.md's table: python -m benchmarks.probe_cpu_collectives_pool "
        "--out docs/benchmarks/cpu_collectives_pool_<machine kind>.json"
    )
    for run in runs:
        by = {r["setting"]: r for r in run["results"]}
        xla = by["one thread per device (XLA's)"]
        assert xla["pool_threads"] == run["devices"] and xla["finished"] < xla["runs"]
        ours = by["gdpo_jax's pool"]
        assert ours["pool_threads"] == POOL_THREADS_PER_DEVICE * run["devices"]
        assert all(r["finished"] == r["runs"] for r in run["results"] if r is not xla)
    text = " ".join(limits.split())
    assert f"`PJRT_NPROC` to {POOL_THREADS_PER_DEVICE} threads per CPU device" in text
    # "The 64-thread pool measured 9 % and 8 % slower than XLA's 8 threads, but the
    # 16-thread row was slower than both": the committed run's figures.
    by = {r["pool_threads"]: r for r in runs[0]["results"]}
    cols = ("one_device_ms", "eight_devices_ms")
    slower = [round(100 * (by[64][k] / by[8][k] - 1)) for k in cols]
    assert f"measured {slower[0]} % and {slower[1]} % slower" in text
    assert all(by[16][k] > max(by[8][k], by[64][k]) for k in cols)


def test_committed_plans_flops_are_todays_count() -> None:
    # A plan's FLOPs are analytic (gdpo_jax/scale/flops.py): a change to the count
    # must regenerate every committed plan that has its step shape, or the docs
    # quote a stale figure.
    import json

    from experiments.plan_table import recount

    scale = ROOT / "docs" / "scale"
    plans = json.loads((scale / "plans.json").read_text(encoding="utf-8"))
    for path in sorted(scale.glob("*/*.json")):
        plans[str(path.relative_to(scale))] = json.loads(path.read_text(encoding="utf-8"))
    checked = 0
    for key, p in plans.items():
        if "step_shape" not in p:  # docs/scale/check: runs, and plans older than step_shape
            continue
        # Today's count from the plan's step shape, as the file holds it; the roofline
        # too (a continuous plan's lanes were left out of it: 1.4x low).
        again = json.loads(json.dumps(recount(p), default=str))
        assert p["flops"] == pytest.approx(again["flops"], rel=1e-9), f"{key}: regenerate it"
        for field in ("roofline", "est_step_s", "step_shape"):
            assert again[field] == p[field], (
                f"{key}: {field} is not today's count; python -m experiments.plan_table --recount"
            )
        checked += 1
    assert checked >= 27, checked  # plans.json 14, sampler/ 8, attention/ 5


def test_recount_rewrites_the_table_beside_the_plans(monkeypatch, tmp_path) -> None:
    # `plan_table --recount` rewrote the plans' figures and left scale.md's table with the
    # old ones, which test_scale_table_is_the_committed_plans then failed on.
    import json
    import subprocess

    from tests._subprocess import child_env

    plan_table = _plan_table(monkeypatch)
    plans = json.loads((ROOT / "docs" / "scale" / "plans.json").read_text(encoding="utf-8"))
    key = next(k for k, p in plans.items() if "step_shape" in p)
    plans[key]["est_step_s"] = 1.0  # stale: the recount restores it
    (tmp_path / "scale").mkdir()
    (tmp_path / "scale" / "plans.json").write_text(json.dumps(plans), encoding="utf-8")
    marks = f"{plan_table.TABLE_START}\nstale\n{plan_table.TABLE_END}"
    sweep = sorted((ROOT / "docs" / "scale" / plan_table.SWEEP_DIR).glob("*.json"))[0]
    swept = json.loads(sweep.read_text(encoding="utf-8"))
    swept["est_step_s"] = 1.0  # its table row quotes the RL step's roofline
    (tmp_path / "scale" / plan_table.SWEEP_DIR).mkdir()
    (tmp_path / "scale" / plan_table.SWEEP_DIR / sweep.name).write_text(json.dumps(swept))
    marks += f"\nbetween\n{plan_table.SWEEP_START}\nstale sweep\n{plan_table.SWEEP_END}"
    (tmp_path / "scale.md").write_text(f"before\n{marks}\nafter\n", encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "experiments.plan_table", "--recount", f"--out={tmp_path}/scale"],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"recounted ['{key}']" in out.stdout
    doc = (tmp_path / "scale.md").read_text(encoding="utf-8")
    table, _ = _committed_plan_table(monkeypatch)
    assert table in doc and "stale" not in doc and "\nbetween\n" in doc
    assert doc.startswith("before\n") and doc.endswith("after\n")
    assert f"recounted {tmp_path}/scale/{plan_table.SWEEP_DIR}/{sweep.name}" in out.stdout
    recounted = {k: plan_table.rederive(v) for k, v in plans.items()}
    recounted[key] = plan_table.recount(recounted[key])
    swept_dir = tmp_path / "scale" / plan_table.SWEEP_DIR  # its one plan, recounted
    assert json.loads((swept_dir / sweep.name).read_text()) == json.loads(sweep.read_text())
    assert plan_table.remat_sweep_table(str(swept_dir), recounted) in doc


def test_committed_plans_record_a_command_that_plans_them(monkeypatch) -> None:
    # Every committed plan names the experiments.plan command that reproduces it; the
    # config that command builds today must be the one planned (equal config_digest),
    # or the configs changed under the plan and it must be made again (the message
    # says how).
    import json

    from experiments.plan_command import parse_plan_command
    from gdpo_jax.scale.plan import config_digest

    monkeypatch.chdir(ROOT)  # the commands' paths are relative to the repository
    scale = ROOT / "docs" / "scale"
    plans = json.loads((scale / "plans.json").read_text(encoding="utf-8"))
    for sub, pattern in (
        ("sampler", "*.json"),
        ("attention", "*.json"),
        ("sharing", "*.json"),
        ("remat", "*.json"),
        ("remat_sweep", "*.json"),
        ("check", "plan_*.json"),  # beside them: the measured runs
    ):
        for path in sorted((scale / sub).glob(pattern)):
            plans[f"{sub}/{path.name}"] = json.loads(path.read_text(encoding="utf-8"))
    assert len(plans) >= 30, len(plans)
    for key, p in plans.items():
        assert "command" in p, f"{key}: no command recorded; make it with experiments.plan --json"
        cfg, topology = parse_plan_command(p["command"])
        assert topology == p["target"], key
        assert config_digest(cfg) == p["config_digest"], f"{key}: stale, rerun {p['command']}"
        if "/" in key:  # made by experiments.plan --json, not by the plan table
            assert p["command"].endswith(f"--json=docs/scale/{key}"), key


def test_prompt_sharing_plan_table_is_the_committed_plans() -> None:
    # scale.md's shared-vs-per-row table was typed in and went stale (the rooflines
    # predated the decode's phase reads); its rows are docs/scale/sharing/*.json now.
    import json

    doc = (ROOT / "docs" / "scale.md").read_text(encoding="utf-8")
    for target, label in (("8xh100", "8xH100"), ("v5e-16", "v5e-16")):
        shared, per_row = (
            json.loads((ROOT / "docs/scale/sharing" / f"tool-1.5b_{target}_{v}.json").read_text())
            for v in ("shared", "per-row")
        )
        assert shared["programs"]["step"]["total_gib"] < per_row["programs"]["step"]["total_gib"]
        step = [p["programs"]["step"]["total_gib"] for p in (shared, per_row)]
        roof = [p["est_step_s"] for p in (shared, per_row)]
        row = f"| {label} | {step[0]:.1f} ({step[1]:.1f}) | {roof[0]:.1f} ({roof[1]:.1f}) |"
        assert row in doc, f"docs/scale.md's prompt-sharing table lacks {row}"


def test_check_plan_examples_plan_a_valid_config(monkeypatch) -> None:
    # scale.md's and check_plan.py's example commands named 4-8 prompts of a config whose
    # 8 x 128 micro-batches and 512 rows per call need 1024: `error:` and exit 2.
    from experiments.plan_command import parse_plan_command
    from gdpo_jax.train.config import validate_config

    monkeypatch.chdir(ROOT)
    texts = {
        "docs/scale.md": (ROOT / "docs" / "scale.md").read_text(encoding="utf-8"),
        "experiments/check_plan.py": (ROOT / "experiments" / "check_plan.py").read_text(
            encoding="utf-8"
        ),
    }
    for where, text in texts.items():
        joined = re.sub(r"\\\n\s*", "", text)  # backslash continuations
        commands = re.findall(
            r"python -m experiments\.plan [^\n`]*--topology=1xh200[^\n`]*", joined
        )
        assert commands, f"{where}: no experiments.plan example for 1xh200"
        for command in commands:
            cfg, topology = parse_plan_command(command)
            cfg.workdir = "/tmp/unused"
            validate_config(cfg, num_devices=1)  # raises ConfigError naming the field


def test_plan_command_round_trips_overrides(monkeypatch) -> None:
    # The parser must apply --config.x overrides (ml_collections reads them from the
    # args it is given, not sys.argv) and ignore the CLI's other flags.
    from experiments.plan_command import parse_plan_command, plan_command

    argv = [
        "--config=configs/tiny_cpu.py",
        "--topology=v5p-8",
        "--config.algo.num_microbatches=4",
        "--config.sampling.decode_growth=copy",
        "--nosearch",
        "--json=/tmp/a b.json",
    ]
    monkeypatch.chdir(ROOT)
    command = plan_command(argv)
    assert "'--json=/tmp/a b.json'" in command  # quoted for a shell
    cfg, topology = parse_plan_command(command)
    assert topology == "v5p-8"
    assert (cfg.algo.num_microbatches, cfg.sampling.decode_growth) == (4, "copy")
    with pytest.raises(ValueError, match="not an experiments.plan command"):
        parse_plan_command("python -m experiments.train --config=configs/tiny_cpu.py")
    with pytest.raises(ValueError, match="no --config or no --topology"):
        parse_plan_command("python -m experiments.plan --config=configs/tiny_cpu.py")


def test_attention_kernel_prose_is_the_committed_plans() -> None:
    # docs/models.md quotes what each kernel saves against the einsum path ("xla").
    import json

    d = ROOT / "docs" / "scale" / "attention"

    def temps(name: str) -> dict[str, float]:
        p = json.loads((d / f"toolcall-1.5b_{name}.json").read_text(encoding="utf-8"))
        return {k: v["temp_gib"] for k, v in p["programs"].items()}

    h_xla, h_dpa, h_cudnn = temps("8xh100_xla"), temps("8xh100_dpa"), temps("8xh100_cudnn")
    v_xla, v_splash = temps("v5p-8_xla"), temps("v5p-8_auto")
    figures = (
        f"einsum path ({h_xla['step'] - h_dpa['step']:.2f} GiB apart)",
        f"step's temporaries by {h_xla['step'] - h_cudnn['step']:.2f} GiB per device",
        f"the sampler's by {h_xla['generate'] - h_cudnn['generate']:.2f} GiB (its prefill",
        f"step's by {v_xla['step'] - v_splash['step']:.2f} GiB and the sampler's by "
        f"{v_xla['generate'] - v_splash['generate']:.2f} GiB",
    )
    doc = " ".join((ROOT / "docs" / "models.md").read_text(encoding="utf-8").split())
    _assert_quotes(doc, figures, "docs/models.md")
    assert h_dpa["generate"] == h_xla["generate"]
    for a, b in ((h_xla, h_dpa), (h_xla, h_cudnn), (v_xla, v_splash)):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=0.01)  # "within 0.01 GiB"


def test_scale_prose_v5e_figures_are_the_committed_plan() -> None:
    # "What the table says" quotes tool calling 1.5B's v5e-16 plan (splash kernel).
    import json

    plans = json.loads((ROOT / "docs" / "scale" / "plans.json").read_text(encoding="utf-8"))
    p = plans["tool-1.5b@v5e-16"]
    g, st = p["programs"]["generate"], p["programs"]["step"]
    assert p["peak_program"] == "generate"
    figure = (
        f"({g['total_gib']:.1f} of {p['usable_gib']:.0f} GiB, in the sampler; "
        f"the step {st['total_gib']:.1f})"
    )
    doc = " ".join((ROOT / "docs" / "scale.md").read_text(encoding="utf-8").split())
    _assert_quotes(doc, (figure,), "docs/scale.md")


def test_the_avx2_kinds_rl_figures_are_its_machine_file() -> None:
    """benchmarks.md's and limits.md's figures for the avx2 kind's RL iteration: its
    machine file's bench_rl (ratios, seconds, the rounds' spread, other processes' CPU)."""
    import json

    run = json.loads((ROOT / "docs/benchmarks/machines/amd-epyc-avx2-2c.json").read_text())
    rl = run["benchmarks"]["bench_rl"]
    b0, b4 = rl["result"]["results"]["beta=0.0"], rl["result"]["results"]["beta=0.04"]

    def spread(r):
        lo, hi = min(r["round_speedup_iter"]), max(r["round_speedup_iter"])
        return f"{lo:.2f}x-{hi:.2f}x"

    pair = f"{b0['speedup_iter']:.2f}x / {b4['speedup_iter']:.2f}x"
    step = f"its step {b0['speedup_step']:.2f}x / {b4['speedup_step']:.2f}x"
    doc = " ".join((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").split())
    figures = (
        f"{100 * rl['host']['other_cpu_frac']:.1f} % other processes' CPU during bench_rl)"
        f" gives {pair}, {step} (ours {b0['gdpo_jax']['iter_s']:.3f} s per beta-0 iteration,"
        f" TRL's {b0['trl']['iter_s']:.3f} s); its rounds' own ratios span {spread(b0)} at"
        f" beta 0 and {spread(b4)} at beta 0.04",
    )
    _assert_quotes(doc, figures, "docs/benchmarks.md (machines/amd-epyc-avx2-2c.json)")
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    peak = run["matmul_peak"]["gflops_per_s"]
    figures = (
        f"amd-epyc-avx2-2c {pair} ({step}; a full run of 2026-12-06, the same settings, matmul"
        f" peak {peak:.0f} GFLOP/s; its rounds' own ratios span {spread(b0)} at beta 0 and"
        f" {spread(b4)} at beta 0.04",
    )
    _assert_quotes(limits, figures, "docs/limits.md (machines/amd-epyc-avx2-2c.json)")


def test_the_guards_cost_is_the_committed_profile_guard_run() -> None:
    """benchmarks.md's guard table renders the committed profile_guard run, and the
    figures quoted after it and in training.md are that run's."""
    import json

    from benchmarks import profile_guard

    res = json.loads((ROOT / "docs/benchmarks/profile_guard_amd-epyc-avx2-2c.json").read_text())
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert profile_guard.table_markdown(res) in text, (
        "docs/benchmarks.md's guard table: python -m benchmarks.profile_guard "
        "--out docs/benchmarks/profile_guard_amd-epyc-avx2-2c.json"
    )
    tiny, smol = (next(r for r in res["results"] if r["model"] == m) for m in ("tiny", "smollm2"))
    costs = [100 * r["cost"] for r in res["results"]]
    best = max(100 * r["cost_best"] for r in res["results"])
    figures = (
        f"measured from {-min(costs):.1f} % faster to {max(costs):.1f} % slower (by the best"
        f" steps, up to {best:.1f} % slower)"
        if min(costs) < 0 < max(costs)
        else "the A/B's own figures (rewrite the sentence)",
        f"{tiny['check_ms']:.2f} ms at {tiny['params'] / 1e6:.1f}M weights and "
        f"{smol['check_ms']:.0f} ms at SmolLM2-135M's {smol['params'] / 1e6:.1f}M",
        f"{100 * tiny['check_share']:.2f} % and {100 * smol['check_share']:.2f} % of the guarded"
        " step",
    )
    _assert_quotes(" ".join(text.split()), figures, "docs/benchmarks.md (profile_guard)")
    training = " ".join((ROOT / "docs" / "training.md").read_text(encoding="utf-8").split())
    share = f"as a pass of its own it takes {100 * smol['check_share']:.2f} % of bench_rl's step"
    _assert_quotes(training, (share,), "docs/training.md (profile_guard)")


def test_limits_cpu_speed_figures_are_each_kinds_latest_row() -> None:
    """limits.md's CPU-speed bullet quotes each machine kind's latest run_all row: the
    RL iteration at both betas ("<kind> a.bcx / d.efx") and the greedy sampler
    ("<kind> a.bcx"), from the same machine files as summary.md."""
    from benchmarks import summary

    flat = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    bullet = flat.split("- CPU speed against TRL", 1)[1].split(" - ", 1)[0]
    for row in summary.summary_rows(str(ROOT / "docs" / "benchmarks" / "machines")):
        kind = row["machine"]
        pair = f"{kind} {row['rl_iter_b0.0']:.2f}x / {row['rl_iter_b0.04']:.2f}x"
        greedy = f"{kind} {row['sampler_greedy']:.2f}x"
        _assert_quotes(bullet, (pair, greedy), f"docs/limits.md (machines/{kind}.json)")


def test_sampler_first_call_figures_are_the_avx512_kinds_run() -> None:
    """The figures benchmarks.md quotes from the avx512 kind's bench_sampler (timed two
    calls a turn): each side's first-call cost, greedy's seconds and the top-k row."""
    import json

    run = json.loads((ROOT / "docs/benchmarks/machines/amd-epyc-avx512-2c.json").read_text())
    res = run["benchmarks"]["bench_sampler"]["result"]
    assert res["timing"].startswith("rounds, 2 calls a turn")
    rows = {r["mode"]: r for r in res["results"]}
    ours = [r["ours_first_s"] - r["ours_s"] for r in rows.values()]
    hf = [r["hf_first_s"] - r["hf_s"] for r in rows.values()]
    g, k, p = rows["greedy"], rows["top-k 50"], rows["sampled"]
    medians = g["hf_median_s"] / g["ours_median_s"]
    flat = " ".join((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").split())

    def sec(x: float) -> str:  # no "-0.00" for a difference that rounds to nothing
        return f"{0.0 if round(x, 2) == 0 else x:.2f}"

    figures = (
        f"ours {sec(min(ours))}-{sec(max(ours))} s more and transformers' {sec(min(hf))}-"
        f"{sec(max(hf))} s",
        f"greedy is {g['speedup']:.2f}x in the latest run ({run['created'][:10]}, two calls a"
        f" turn, the second timed; by the calls' medians {medians:.2f}x)",
        f"Our greedy took {g['ours_s']:.3f} s there and its first call of a turn "
        f"{g['ours_first_s']:.3f} s; transformers' {g['hf_s']:.3f} s and {g['hf_first_s']:.3f} s",
        f"took {k['ours_s']:.3f} s in the avx512 kind's machine file, against {p['ours_s']:.3f}"
        f" s for plain sampling: {k['speedup']:.2f}x transformers",
    )
    _assert_quotes(flat, figures, "docs/benchmarks.md (machines/amd-epyc-avx512-2c.json)")


def test_cpu_smollm2_sampler_section_is_the_committed_runs() -> None:
    """benchmarks.md's SmolLM2-shape CPU sampler section renders the committed run timed two
    calls a turn, and its prose (and limits.md) quote that run's first-call costs and
    ratios and the three runs timed one call a turn."""
    import json

    from benchmarks import bench_sampler

    name = "sampler_smollm2_amd-epyc-avx512-2c"
    runs = {
        k: json.loads((ROOT / "docs" / "benchmarks" / f"{name}{k}.json").read_text())
        for k in ("_turns", "_one_call", "", "_earlier")
    }
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    turns = runs["_turns"]
    assert bench_sampler.format_table(turns) in doc, (
        "python -m benchmarks.bench_sampler --model smollm2 --out "
        f"docs/benchmarks/{name}_turns.json"
    )
    for res in runs.values():
        assert res["model_name"] == "smollm2" and res["hf_device"] == "cpu"
        assert res["machine"]["cpu_isa"] == "avx512" and res["greedy_rows_identical_to_hf"] == 1
    assert turns["timing"].startswith("rounds, 2 calls a turn")
    assert all("timing" not in runs[k] for k in ("_one_call", "", "_earlier"))
    speed = {k: {r["mode"]: r["speedup"] for r in res["results"]} for k, res in runs.items()}
    ours = {k: {r["mode"]: r["ours_s"] for r in res["results"]} for k, res in runs.items()}
    first = [
        (r["ours_first_s"] - r["ours_s"], r["hf_first_s"] - r["hf_s"]) for r in turns["results"]
    ]
    sampling = sorted(speed["_turns"][m] for m in ("sampled", "top-k 50"))
    old, a, b = speed["_one_call"], speed[""], speed["_earlier"]
    flat = " ".join(
        doc.split("### At SmolLM2-135M's shapes on CPU", 1)[1].split("\n## ")[0].split()
    )
    figures = (
        f"took {min(f[0] for f in first):.2f}-{max(f[0] for f in first):.2f} s more than the"
        f" second (`ours_first_s`), transformers' {min(f[1] for f in first):.2f}-"
        f"{max(f[1] for f in first):.2f} s more",
        f"gave greedy {old['greedy']:.2f}x, sampled {old['sampled']:.2f}x and top-k 50 "
        f"{old['top-k 50']:.2f}x, our side {min(ours['_one_call'].values()):.2f}-"
        f"{max(ours['_one_call'].values()):.2f} s",
        f"greedy {a['greedy']:.2f}x and {b['greedy']:.2f}x, sampled {a['sampled']:.2f}x and "
        f"{b['sampled']:.2f}x, top-k 50 {a['top-k 50']:.2f}x and {b['top-k 50']:.2f}x, our "
        f"side {ours['']['greedy']:.2f} s and {ours['_earlier']['greedy']:.2f} s greedy",
        f"greedy decoding is {speed['_turns']['greedy']:.2f}x `generate()` and sampling with or"
        f" without top-k {sampling[0]:.2f}x-{sampling[1]:.2f}x",
    )
    _assert_quotes(flat, figures, "docs/benchmarks.md's SmolLM2 CPU sampler section")
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    quote = f"{speed['_turns']['greedy']:.2f}x at SmolLM2-135M's shapes"
    _assert_quotes(limits, (quote,), "docs/limits.md")


def test_host_section_is_the_committed_run() -> None:
    """benchmarks.md's host-work table (inside a list item) renders the committed
    profile_host run, and the prose beside it quotes that row's reference-pass times."""
    import json

    from benchmarks import profile_host

    res, flat = _committed_run_in_benchmarks(
        "host_intel-xeon-avx512-2c.json",
        profile_host.table_markdown,
        "python -m benchmarks.profile_host",
    )
    rl = json.loads(
        (ROOT / "docs" / "benchmarks" / "machines" / "intel-xeon-avx512-2c.json").read_text()
    )["benchmarks"]["bench_rl"]["result"]["results"]
    added = {
        fw: rl["beta=0.04"][fw]["step_s"] - rl["beta=0.0"][fw]["step_s"]
        for fw in ("gdpo_jax", "trl")
    }
    _assert_quotes(
        flat,
        (
            f"the reference pass adds {added['gdpo_jax']:.2f} s to our step and "
            f"{added['trl']:.2f} s to TRL's in that row",
        ),
        "docs/benchmarks.md's Intel Xeon profile",
    )


def test_reference_forward_section_is_the_committed_run() -> None:
    """benchmarks.md's reference-pass tables render the committed profile_ref runs
    (the Xeon's, from before the beta-0 baseline, and the avx512 kind's with it), and
    the prose quotes those runs' speed-up and cost ranges and the FLOP share."""
    import json

    from benchmarks import profile_ref

    flat = " ".join((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").split())
    runs = {}
    for kind in ("intel-xeon-avx512-2c", "amd-epyc-avx512-2c"):
        name = f"profile_ref_{kind}.json"
        runs[kind] = res = json.loads((ROOT / "docs" / "benchmarks" / name).read_text())
        assert " ".join(profile_ref.table_markdown(res).split()) in flat, (
            f"docs/benchmarks.md's reference-pass table differs from docs/benchmarks/{name} "
            "(python -m benchmarks.profile_ref --microbatches 4,4,4 --out <it>)"
        )

    def span(res: dict, key: str, num: str = "separate", den: str = "in_step") -> list[float]:
        return sorted(r[f"{num}_{key}"] / r[f"{den}_{key}"] for r in res["ref_ab"])

    def x(v: list[float]) -> str:
        return f"{v[0]:.2f}x-{v[-1]:.2f}x"

    def pct(v: list[float]) -> str:
        return f"{v[0] - 1:+.0%} to {v[-1] - 1:+.0%}"

    xeon, amd = runs["intel-xeon-avx512-2c"], runs["amd-epyc-avx512-2c"]
    _assert_quotes(
        flat,
        (
            f"as fast either way ({x(span(xeon, 'median_s'))})",
            f"measured {x(span(xeon, 'iter_median_s'))} per iteration and "
            f"{x(span(xeon, 'iter_step_median_s'))} per step",
            f"adds {pct(span(amd, 'median_s', 'in_step', 'none'))} to the step alone and "
            f"{pct(span(amd, 'iter_step_median_s', 'in_step', 'none'))} to the step inside",
            f"its model-FLOP share, +{amd['reference_flop_share']:.0%}",
            f"within noise ({x(span(amd, 'median_s'))} alone, "
            f"{x(span(amd, 'iter_step_median_s'))} inside the iteration)",
        ),
        "docs/benchmarks.md (docs/benchmarks/profile_ref_*.json)",
    )
    added = sorted(
        r["in_step_iter_step_median_s"] - r["none_iter_step_median_s"] for r in amd["ref_ab"]
    )
    added += sorted(r["in_step_median_s"] - r["none_median_s"] for r in amd["ref_ab"])
    assert f"({min(added):.3f} s to {max(added):.3f} s)" in flat
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())

    def dash(v: list[float]) -> str:
        return f"{v[0]:.2f}-{v[-1]:.2f}x"

    _assert_quotes(
        limits,
        (
            f"Intel Xeon: {dash(span(xeon, 'iter_median_s'))} per RL iteration",
            f"the step alone {dash(span(xeon, 'median_s'))}",
            f"avx512 AMD: {dash(span(amd, 'iter_median_s'))} and {dash(span(amd, 'median_s'))}",
        ),
        "docs/limits.md (docs/benchmarks/profile_ref_*.json)",
    )


def test_ab_commits_section_is_the_committed_run() -> None:
    """benchmarks.md's same-session A/B of two commits renders the committed
    `ab_commits` run, and its prose quotes the run's base, ratios and ranges."""
    import json

    from benchmarks import ab_commits

    name = "ab_commits_amd-epyc-avx512-2c.json"
    res, flat = _committed_run_in_benchmarks(
        name, ab_commits.table_markdown, "python -m benchmarks.ab_commits --base <commit>"
    )
    it = res["summary"]["iter_s"]
    _assert_quotes(
        flat,
        (
            f"--base {res['base'][:7]} --pairs {res['pairs']}",
            f"the working tree's median RL iteration {it['head_over_base']:.2f}x the base's",
        ),
        "docs/benchmarks.md (docs/benchmarks/" + name + ")",
    )
    # The earlier, smaller run of the same two commits, quoted beside it.
    earlier = name.replace(".json", "_8pairs.json")
    old = json.loads((ROOT / "docs" / "benchmarks" / earlier).read_text())
    o = old["summary"]["iter_s"]
    assert old["base"] == res["base"] and old["pairs"] == 8
    _assert_quotes(
        flat,
        (
            f"The same pair of commits with {old['pairs']} pairs",
            f"working tree at {old['head'][:7]}",
            f"]({'benchmarks/' + earlier})",
            f"gave {o['head_over_base']:.2f}x (base {o['base_s']:.3f} s, head {o['head_s']:.3f} s)",
        ),
        "docs/benchmarks.md (docs/benchmarks/" + earlier + ")",
    )


def test_old_logprob_pass_section_is_the_committed_run() -> None:
    """benchmarks.md's old log-prob table renders the committed `profile_ref --pass
    old` run, and benchmarks.md, training.md and limits.md quote its ranges."""
    from benchmarks import profile_ref

    name = "profile_old_logp_amd-epyc-avx512-2c.json"
    res, flat = _committed_run_in_benchmarks(
        name,
        profile_ref.table_markdown,
        "python -m benchmarks.profile_ref --pass old --microbatches 4,4,4",
    )
    assert res["pass"] == "old" and len(res["old_ab"]) == 3

    def span(key: str, num: str = "separate", den: str = "in_step") -> list[float]:
        return sorted(r[f"{num}_{key}"] / r[f"{den}_{key}"] for r in res["old_ab"])

    def x(v: list[float]) -> str:
        lo, hi = f"{v[0]:.2f}", f"{v[-1]:.2f}"
        return f"{lo}x" if lo == hi else f"{lo}x-{hi}x"

    def pct(v: list[float]) -> str:
        return f"{v[0] - 1:+.0%} to {v[-1] - 1:+.0%}"

    added = sorted(r["separate_median_s"] - r["none_median_s"] for r in res["old_ab"])
    alone, inside, it = span("median_s"), span("iter_step_median_s"), span("iter_median_s")
    _assert_quotes(
        flat,
        (
            f"({pct(span('median_s', 'in_step', 'none'))} on the step alone, "
            f"{pct(span('iter_median_s', 'in_step', 'none'))} per iteration)",
            f"adds {pct(span('median_s', 'separate', 'none'))} to the step alone "
            f"({added[0]:.3f} s to {added[-1]:.3f} s)",
            f"a forward's model-FLOP share, +{res['forward_flop_share']:.0%}",
            f"step {x(alone)} faster alone",
            f"and {x(inside)} faster inside the RL iteration, and the iteration {x(it)} faster",
        ),
        "docs/benchmarks.md (docs/benchmarks/" + name + ")",
    )
    training = " ".join((ROOT / "docs" / "training.md").read_text(encoding="utf-8").split())
    _assert_quotes(
        training,
        (f"the step ran {x(alone)} faster alone and the RL iteration {x(it)} faster",),
        "docs/training.md (docs/benchmarks/" + name + ")",
    )
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    _assert_quotes(
        limits,
        (f"avx512 AMD: the step {x(alone)}, the RL iteration {x(it)} faster",),
        "docs/limits.md (docs/benchmarks/" + name + ")",
    )


def test_step_ops_section_is_the_committed_run() -> None:
    """benchmarks.md's step-by-product table renders the committed profile_step_ops
    run, and its prose quotes that run's shares and rates."""
    from benchmarks import profile_step_ops as S

    name = "step_ops_intel-xeon-avx512-2c.json"
    res, flat = _committed_run_in_benchmarks(
        name, S.table_markdown, "python -m benchmarks.profile_step_ops"
    )
    ms, total, rates = res["ms_per_step"], res["traced_ms_per_step"], res["gflops"].values()

    def share(part: str) -> str:
        return f"{ms[part] / total:.0%}".replace("%", " %")

    weights = sum(ms[k] for k in S.WEIGHT_SPECS.values())
    _assert_quotes(
        flat,
        (
            f"{weights / total:.0%} of the step ({weights:.1f} of {total:.1f} ms)".replace(
                "%", " %"
            ),
            f"run at {min(rates):.0f}-{max(rates):.0f} GFLOP/s there",
            f'("other", {share(S.OTHER)}:',
            f"transposes ({share(S.TRANSPOSES)}:",
            f"generic dots ({share(S.GENERIC_DOTS)}:",
            f"reductions ({share(S.REDUCTIONS)})",
            f"runs ({share(S.ATTENTION)})",
            f"worth at most their {share(S.GENERIC_DOTS)} less",
        ),
        f"docs/benchmarks.md (docs/benchmarks/{name})",
    )


def test_smollm2_entropy_section_is_the_committed_runs() -> None:
    """benchmarks.md's SmolLM2 entropy bullet renders the committed profile_step_ops
    run (after) and the ab_commits A/B, and quotes the before run's reductions, both
    runs' untraced steps and the A/B's ratios and ranges."""
    import json

    from benchmarks import ab_commits
    from benchmarks import profile_step_ops as S

    after, flat = _committed_run_in_benchmarks(
        "step_ops_smollm2_amd-epyc-avx512-2c.json",
        S.table_markdown,
        "python -m benchmarks.profile_step_ops --model smollm2",
    )
    name = "step_ops_smollm2_before_entropy_amd-epyc-avx512-2c.json"
    before = json.loads((ROOT / "docs" / "benchmarks" / name).read_text())
    assert after["model"] == before["model"] == "smollm2"
    red = S.REDUCTIONS
    ab, _ = _committed_run_in_benchmarks(
        "ab_entropy_smollm2_amd-epyc-avx512-2c.json",
        ab_commits.table_markdown,
        "python -m benchmarks.ab_commits --model smollm2",
    )
    assert ab["model"] == "smollm2" and ab["base"].startswith("36c43b4")

    def spread(side: str) -> str:
        v = [r["step_s"] for r in ab["runs"][side]]
        return f"{min(v):.2f}-{max(v):.2f}"

    s = ab["summary"]
    _assert_quotes(
        flat,
        (
            f"]({'benchmarks/' + name})",
            f"from {before['ms_per_step'][red]:.1f} to {after['ms_per_step'][red]:.1f} ms per "
            "traced step",
            f"({before['traced_ms_per_step']:.0f} and {after['traced_ms_per_step']:.0f} ms in all)",
            f"were {before['wall_median_s']:.2f} and {after['wall_median_s']:.2f} s (median",
            f"--base 36c43b4 --model smollm2 --iters {ab['iters']} --pairs {ab['pairs']}",
            f"the step {s['step_s']['head_over_base']:.3f}x the base's and the iteration "
            f"{s['iter_s']['head_over_base']:.3f}x",
            f"(steps {spread('base')} s against {spread('head')} s)",
        ),
        "docs/benchmarks.md (the SmolLM2 entropy runs)",
    )
    rates = after["gflops"].values()
    assert f"at {min(rates):.0f}-{max(rates):.0f} GFLOP/s over their share of the trace" in flat
    weights = sum(after["ms_per_step"][k] for k in S.WEIGHT_SPECS.values())
    assert 0.7 < weights / after["traced_ms_per_step"] < 0.8  # "three quarters of this step"
    # The docstring's and algorithms.md's "about twice as long": the before run's
    # reductions over the after run's.
    assert 1.6 < before["ms_per_step"][red] / after["ms_per_step"][red] < 2.4


def test_decode_ops_section_is_the_committed_run() -> None:
    """benchmarks.md's decode-by-product table renders the committed
    profile_decode_ops run, and its prose quotes that run's shares."""
    import json

    from benchmarks import bench_sampler, profile_decode_ops

    res = json.loads(
        (ROOT / "docs" / "benchmarks" / "decode_ops_intel-xeon-avx512-2c.json").read_text()
    )
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert profile_decode_ops.table_markdown(res) in doc, (
        "docs/benchmarks.md's decode-by-product table differs from "
        "docs/benchmarks/decode_ops_intel-xeon-avx512-2c.json (python -m "
        "benchmarks.profile_decode_ops --out <it>)"
    )
    ms, total, rates = res["ms_per_step"], res["traced_ms_per_step"], res["gflops"]
    names = {*profile_decode_ops.weight_widths(bench_sampler.HF_CONFIG).values()}
    weights = sum(v for k, v in ms.items() if k in names or k == profile_decode_ops.OTHER_WIDTHS)
    attention = sum(v for k, v in ms.items() if k.startswith("attention"))
    own = ms["attention, own slots: q @ k"] + ms["attention, own slots: p @ v"]
    decode_rates = [rates[k] for k in names if k in rates]
    flat = " ".join(doc.split())

    def share(x: float) -> str:
        return f"{x / total:.0%}".replace("%", " %")

    _assert_quotes(
        flat,
        (
            f"{share(weights)} of the step ({weights:.2f} of {total:.2f} ms)",
            f"run at {min(decode_rates):.0f}-{max(decode_rates):.0f} GFLOP/s there",
            f"The attention dots are {share(attention)} ({attention:.2f} ms,",
            f"YNNPACK's reductions (the softmax's max and sum, the norms' sums) "
            f"{share(ms['reductions (YNNPACK)'])}",
            f"and the rest {share(ms['other'])}",
            f"take {own / ms['q/k/v (fused)']:.1f}x the fused q/k/v product's time",
        ),
        "docs/benchmarks.md's decode-by-product prose",
    )
    assert len(decode_rates) == 4  # q/k/v, o and down, gate/up, the unembedding


def test_decode_threads_section_is_the_committed_runs() -> None:
    """benchmarks.md's avx2 decode profile and probe_decode_threads tables render the
    committed runs, and the prose (there and in limits.md) quotes what they give: the
    products' rates in the step, the one-thread o projection and the estimate of what
    two cores on the o and down projections would save."""
    import json

    from benchmarks import bench_sampler, probe_decode_threads, profile_decode_ops

    bench = ROOT / "docs" / "benchmarks"
    ops = json.loads((bench / "decode_ops_amd-epyc-avx2-2c.json").read_text())
    thr = json.loads((bench / "decode_threads_amd-epyc-avx2-2c.json").read_text())
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert profile_decode_ops.table_markdown(ops) in doc, "decode_ops_amd-epyc-avx2-2c.json"
    assert probe_decode_threads.table_markdown(thr) in doc, "decode_threads_amd-epyc-avx2-2c.json"
    names = {*profile_decode_ops.weight_widths(bench_sampler.HF_CONFIG).values()}
    in_step = [ops["gflops"][k] for k in names]
    by = {r["product"]: r for r in thr["rows"]}
    best = max(r["gflops_all_cores"] for r in thr["rows"])
    wider = [r["second_core_speedup"] for k, r in by.items() if k != "o projection"]
    layers = bench_sampler.HF_CONFIG["num_hidden_layers"]
    saved = 0.0
    for name in ("o projection", "down projection"):
        m, k, n = by[name]["m_k_n"]
        saved += layers * (by[name]["ms_all_cores"] - 2 * m * k * n / (best * 1e9) * 1e3)
    step = ops["wall_best_ms_per_step"]
    share = ops["ms_per_step"]["o and down projections"] / ops["traced_ms_per_step"]
    assert by["o projection"]["second_core_speedup"] < 1.1  # what the prose says
    ind = thr["independent"]
    assert ind["chained_ms"] / ind["side_by_side_ms"] < 1.1
    rates = f"{min(in_step):.0f}-{max(in_step):.0f} GFLOP/s"
    flat = " ".join(doc.split())
    _assert_quotes(
        flat,
        (
            f"Here the weight products run at {rates} inside the step",
            f"(up to {best:.0f} GFLOP/s: the next table)",
            f"projections take {share:.0%} of the step".replace("%", " %"),
            f"run {min(wider):.1f}-{max(wider):.1f}x faster with it",
            f"the best two-core rate of the table ({best:.0f} GFLOP/s)",
            f"about {saved:.2f} ms shorter ({layers} layers), some "
            f"{saved / step:.0%} of its {step:.2f} ms".replace("%", " %"),
        ),
        "docs/benchmarks.md (decode_ops / decode_threads amd-epyc-avx2-2c.json)",
    )
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    _assert_quotes(
        limits,
        (
            f"they run at {rates}",
            f"about {saved:.2f} ms ({saved / step:.0%}) shorter".replace("%", " %"),
        ),
        "docs/limits.md (decode_ops / decode_threads amd-epyc-avx2-2c.json)",
    )


# The replicas' summary tables in docs/results.md: (results dir, column metrics, decimals).
_REPLICA_TABLES = {
    "toolcall": (
        "| estimator | correctness [-3, 3] | AST accuracy | format |",
        ("eval/toolcall_correctness", "eval/accuracy", "eval/format"),
        (3, 3, 3),
    ),
    "math": (
        "| estimator | pass@1 | Exceed ratio | length reward (gated) | length (tokens) |",
        ("eval/pass@1", "eval/exceed_ratio", "eval/length", "eval/mean_length"),
        (3, 3, 3, 1),
    ),
    "math_plain": (
        "| estimator | pass@1 | Exceed ratio | length reward | length (tokens) |",
        ("eval/pass@1", "eval/exceed_ratio", "eval/length", "eval/mean_length"),
        (3, 3, 3, 1),
    ),
}


def replica_table(name: str) -> str:
    """docs/results.md's summary table of a replica: mean ± std over seeds of each
    metric after RL, the warm start first, rendered from its committed results.json."""
    import json

    from gdpo_jax.train.plots import LABELS

    header, metrics, decimals = _REPLICA_TABLES[name]
    res = json.loads((ROOT / "docs" / "results" / name / "results.json").read_text())
    lines = [header, "|---" * (len(metrics) + 1) + "|"]
    for row, cells in res["rows"].items():
        label = "warm start" if row.startswith("warm start") else LABELS[row]
        vals = [
            f"{cells[m]['mean']:.{d}f} ± {cells[m]['std']:.{d}f}" for m, d in zip(metrics, decimals)
        ]
        lines.append(f"| {label} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


@pytest.mark.parametrize("name", sorted(_REPLICA_TABLES))
def test_replica_tables_are_the_committed_runs(name: str) -> None:
    # They were typed in from results.json; the tool-calling one was then rerun.
    doc = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert replica_table(name) in doc, f"docs/results.md, {name}:\n{replica_table(name)}"
    if name == "toolcall":  # the paired differences its prose quotes
        import json

        res = json.loads((ROOT / "docs" / "results" / name / "results.json").read_text())
        gdpo = res["paired_vs_grpo"]["gdpo"]
        pair = {m: f"{gdpo[m]['mean']:+.2f} ± {gdpo[m]['std']:.2f}" for m in gdpo}
        prose = " ".join(doc.split())
        want = (
            f"GDPO − GRPO: correctness {pair['eval/toolcall_correctness']}, "
            f"format {pair['eval/format']})"
        )
        assert want in prose, want


def test_the_shared_prompt_loop_figures_are_the_committed_run() -> None:
    """benchmarks.md's step-forms table renders the committed profile_shared_loop run, and
    the ratios quoted after it and in training.md, limits.md and speed.md are that run's."""
    from benchmarks import profile_shared_loop

    name = "shared_loop_amd-epyc-avx512-2c.json"
    res, text = _committed_run_in_benchmarks(
        name,
        profile_shared_loop.table_markdown,
        f"python -m benchmarks.profile_shared_loop --out docs/benchmarks/{name}",
    )
    r = {row["width"]: row["forms"] for row in res["results"]}
    long, short = r[240], r[16]
    two = (long["two_calls"], short["two_calls"])
    per_row = (long["per_row"], short["per_row"])
    unrolled = (long["unrolled"], short["unrolled"])
    later = [
        u["first_call_s"] - w["one_loop"]["first_call_s"]
        for u, w in zip(unrolled, (long, short), strict=True)
    ]
    repaid = [f"{u['repaid_after_steps']:.0f}" for u in unrolled]
    _assert_quotes(
        text,
        (
            f"The one loop is {two[0]['vs_shipped']:.2f}x as fast at the config's 240-token prompts"
            f" and {two[1]['vs_shipped']:.2f}x at 16-token ones (medians; by the best steps "
            f"{two[0]['vs_shipped_best']:.2f}x and {two[1]['vs_shipped_best']:.2f}x)",
            f"Without sharing the step takes {per_row[0]['vs_shipped']:.2f}x the one loop's time "
            f"at 240-token prompts and {per_row[1]['vs_shipped']:.2f}x at 16-token ones",
            f"With the layers unrolled the step takes {unrolled[0]['vs_shipped']:.2f}x the one "
            f"loop's time at 240-token prompts and {unrolled[1]['vs_shipped']:.2f}x at 16-token "
            f"ones, and its first call {later[0]:.1f} s and {later[1]:.1f} s longer: it has made "
            f"up its start after {repaid[0]} and {repaid[1]} steps",
        ),
        "docs/benchmarks.md (profile_shared_loop)",
    )
    same = all(
        abs(f[k] / row["forms"]["one_loop"][k] - 1) < 1e-4
        for row in res["results"]
        for f in row["forms"].values()
        for k in ("loss", "grad_norm")
    )
    claim = "forms took the same first update as the one loop up to f32 sums"
    assert (claim in text) == same, f"docs/benchmarks.md: {claim!r} only where the run shows it"

    def fold(doc: str) -> str:
        return " ".join((ROOT / "docs" / doc).read_text(encoding="utf-8").split())

    _assert_quotes(
        fold("training.md"),
        (f"step {two[0]['vs_shipped']:.2f}x as fast at its 240-token prompts",),
        "docs/training.md (profile_shared_loop)",
    )
    _assert_quotes(
        fold("limits.md"),
        (
            f"step {two[0]['vs_shipped']:.2f}x as fast at its 240-token prompts and "
            f"{two[1]['vs_shipped']:.2f}x at 16-token ones",
            f"takes {per_row[0]['vs_shipped']:.2f}x and {per_row[1]['vs_shipped']:.2f}x its time",
            f"unrolled step takes {unrolled[0]['vs_shipped']:.2f}x the scan's time at 240-token "
            f"prompts and {unrolled[1]['vs_shipped']:.2f}x at 16-token ones, and its first call "
            f"is {later[0]:.1f} s and {later[1]:.1f} s longer, made up after {repaid[0]} and "
            f"{repaid[1]} steps",
        ),
        "docs/limits.md (profile_shared_loop)",
    )
    rows = sorted(f["vs_shipped"] for f in per_row)
    steps = sorted(f["repaid_after_steps"] for f in unrolled)
    times = sorted(f["vs_shipped"] for f in unrolled)
    _assert_quotes(
        fold("speed.md"),
        (
            f"the per-row forward takes {rows[0]:.2f}-{rows[1]:.2f}x its step time",
            f"unrolled steps take {times[0]:.2f}-{times[1]:.2f}x the scan's time but compile "
            f"longer, made up after {steps[0]:.0f}-{steps[1]:.0f} steps",
        ),
        "docs/speed.md (profile_shared_loop)",
    )


def test_remat_policy_table_is_the_committed_plans() -> None:
    """scale.md's remat table renders docs/scale/remat/*.json, and the figures its
    bullets quote are those plans'."""
    import json

    doc = _committed_table_in("remat_table", "remat", "scale.md", rows=6)
    flat = " ".join(doc.split())
    p = {
        path.stem: json.loads(path.read_text(encoding="utf-8"))
        for path in (ROOT / "docs" / "scale" / "remat").glob("*.json")
    }
    h, v = "math-7b_8xh100_", "math-7b_v5p-32_"

    def step(key: str) -> float:
        return p[key]["programs"]["step"]["total_gib"]

    def train(key: str) -> float:
        return p[key]["roofline"]["train"]

    assert not p[h + "none"]["fits"] and p[v + "none"]["fits"] and p[h + "dots"]["fits"]
    ratio = {train(t + "dots") / train(t + "full") for t in (h, v)}
    assert len({f"{r:.2f}" for r in ratio}) == 1, ratio  # the one figure quoted for both
    _assert_quotes(
        flat,
        (
            f"Without remat the step needs {step(h + 'none'):.1f} GiB per H100 (it does not fit) "
            f"and {step(v + 'none'):.1f} of the v5p-32's {p[v + 'none']['usable_gib']:.1f} usable",
            f"(53.3 and 45.2 GiB; on the H100s the step becomes the binding program, above the "
            f"sampler's {p[h + 'dots']['programs']['generate']['total_gib']:.1f})".replace(
                "53.3 and 45.2", f"{step(h + 'dots'):.1f} and {step(v + 'dots'):.1f}"
            ),
            f"roofline from {train(h + 'full'):.0f} to {train(h + 'dots'):.0f} s per RL step on "
            f"8xH100 and from {train(v + 'full'):.0f} to {train(v + 'dots'):.0f} on the v5p-32: "
            f"{ratio.pop():.2f}x",
            f"({p[h + 'full']['est_step_s']:.0f} to {p[h + 'dots']['est_step_s']:.0f} s, "
            f"{p[v + 'full']['est_step_s']:.0f} to {p[v + 'dots']['est_step_s']:.0f})",
        ),
        "docs/scale.md (remat)",
    )
    assert p[h + "dots"]["peak_program"] == "step"


def test_remat_sweep_table_is_every_paper_config_with_dots(monkeypatch) -> None:
    """scale.md's remat sweep renders docs/scale/remat_sweep/*.json beside plans.json
    (`plan_table --remat_policy=dots`), covers every entry of the plan table, and the
    figures its bullets quote are those plans'."""
    import json

    plan_table = _plan_table(monkeypatch)
    scale = ROOT / "docs" / "scale"
    plans = json.loads((scale / "plans.json").read_text(encoding="utf-8"))
    plans = {k: plan_table.rederive(v) for k, v in plans.items()}
    directory = scale / plan_table.SWEEP_DIR
    doc = (ROOT / "docs" / "scale.md").read_text(encoding="utf-8")
    section = doc.split(plan_table.SWEEP_START, 1)[1].split(plan_table.SWEEP_END, 1)[0]
    assert section.strip() == plan_table.remat_sweep_table(str(directory), plans), (
        "docs/scale.md's remat sweep differs from docs/scale/remat_sweep/ "
        "(python -m experiments.plan_table --remat_policy=dots rewrites it)"
    )
    swept = {}
    for path in directory.glob("*.json"):
        pid, target, policy = path.stem.rsplit("_", 2)
        swept[f"{pid}@{target}"] = json.loads(path.read_text(encoding="utf-8"))
        assert policy == "dots" == swept[f"{pid}@{target}"]["step_shape"]["remat_policy"]
    assert swept.keys() == plans.keys()  # every entry, and no other
    assert {p["step_shape"]["remat_policy"] for p in plans.values()} == {"full"}
    n, fit = len(swept), [k for k, p in swept.items() if p["fits"]]
    minutes = sum(p["plan_s"] for p in swept.values()) / 60
    assert f"avx512, {minutes:.0f} min of planning)" in " ".join(doc.split())
    (miss,) = set(swept) - set(fit)  # the bullets name the one entry that does not fit
    assert miss == "tool-1.5b@v5e-16"
    assert swept[miss]["suggestion"]["overrides"] == ["--config.model.remat_policy=full"]

    def ratios(field) -> str:
        r = [field(swept[k]) / field(plans[k]) for k in swept]
        return f"{min(r):.2f}x-{max(r):.2f}x"

    binding = [sum(p["peak_program"] == "step" for p in d.values()) for d in (swept, plans)]
    fullest = max(fit, key=lambda k: swept[k]["peak_gib"] / swept[k]["usable_gib"])
    assert fullest in ("math-r1-7b@8xh100", "code-r1-7b@8xh100")  # "R1-Distill-7B's on 8xH100"
    _assert_quotes(
        " ".join(doc.split()),
        (
            f"`dots` fits {len(fit)} of the {n} entries",
            f"needs {swept[miss]['peak_gib']:.1f} GiB per chip with it, of "
            f"{swept[miss]['usable_gib']:.2f} usable",
            f"training phase's roofline to {ratios(lambda p: p['roofline']['train'])} of "
            f"`full`'s and the whole RL step's to {ratios(lambda p: p['est_step_s'])}",
            f"binding program of {binding[0]} of the {n} (of {binding[1]} with `full`), at "
            f"{ratios(lambda p: p['programs']['step']['total_gib'])} `full`'s step memory",
            f"the fullest device is R1-Distill-7B's on 8xH100, {swept[fullest]['peak_gib']:.1f} "
            f"of {swept[fullest]['usable_gib']:.1f} GiB",
        ),
        "docs/scale.md (remat sweep)",
    )


def test_remat_policy_cpu_figures_are_the_committed_run() -> None:
    """benchmarks.md's remat table renders the committed profile_remat run, and every
    ratio its bullets quote is that run's."""
    from benchmarks import profile_remat

    name = "remat_amd-epyc-avx512-2c.json"
    res, text = _committed_run_in_benchmarks(
        name,
        profile_remat.table_markdown,
        f"python -m benchmarks.profile_remat --out docs/benchmarks/{name}",
    )
    r = {(x["microbatches"], x["layers"]): x for x in res["results"]}
    scan, unrolled = (r[4, "scan"], r[1, "scan"]), (r[4, "unrolled"], r[1, "unrolled"])
    assert all(x["dots_vs_off"] < 1 for x in scan)  # the bullet's claim
    assert all(x["full_vs_off"] > 1 for x in unrolled)
    _assert_quotes(
        text,
        (
            f"{scan[0]['dots_vs_off']:.2f}x its step time at 4 micro-batches and "
            f"{scan[1]['dots_vs_off']:.2f}x at 1",
            f"re-runs the products too: {scan[0]['full_vs_off']:.2f}x and "
            f"{scan[1]['full_vs_off']:.2f}x",
            f"`full` {unrolled[0]['full_vs_off']:.2f}x and {unrolled[1]['full_vs_off']:.2f}x, "
            f"`dots` {unrolled[0]['dots_vs_off']:.2f}x and {unrolled[1]['dots_vs_off']:.2f}x",
            f"({unrolled[0]['off_median_s']:.3f} s) stays bench_rl's fastest form",
        ),
        "docs/benchmarks.md (profile_remat)",
    )
    fastest = min((x[f"{f}_median_s"], k, f) for k, x in r.items() for f in ("off", "full", "dots"))
    assert fastest[1:] == ((4, "unrolled"), "off"), fastest


def test_remat_policy_smollm2_figures_are_the_committed_run() -> None:
    """The SmolLM2-size remat table renders its committed run, and the ratios quoted after
    it and in limits.md and speed.md are that run's."""
    from benchmarks import profile_remat

    name = "remat_smollm2_amd-epyc-avx512-2c.json"
    res, text = _committed_run_in_benchmarks(
        name,
        profile_remat.table_markdown,
        f"python -m benchmarks.profile_remat --model smollm2 --out docs/benchmarks/{name}",
    )
    assert res["model"] == "smollm2"
    r = {x["layers"]: x for x in res["results"]}
    scan, unrolled = r["scan"], r["unrolled"]
    _assert_quotes(
        text,
        (
            f"(`--model smollm2 --microbatches {scan['microbatches']} --steps "
            f"{res['steps_timed']}`",
            f"costs about what no remat does ({scan['dots_vs_off']:.2f}x under the scan, "
            f"{unrolled['dots_vs_off']:.2f}x unrolled) and `full` {scan['full_vs_off']:.2f}x "
            f"and {unrolled['full_vs_off']:.2f}x",
        ),
        "docs/benchmarks.md (profile_remat --model smollm2)",
    )
    limits = " ".join((ROOT / "docs" / "limits.md").read_text(encoding="utf-8").split())
    _assert_quotes(
        limits,
        (
            f"it takes {scan['dots_vs_off']:.2f}x no remat's step time under the scan and "
            f"`full` {scan['full_vs_off']:.2f}x",
        ),
        "docs/limits.md (profile_remat)",
    )
    dots = sorted(x["dots_vs_off"] for x in res["results"])
    full = sorted(x["full_vs_off"] for x in res["results"])
    speed = " ".join((ROOT / "docs" / "speed.md").read_text(encoding="utf-8").split())
    _assert_quotes(
        speed,
        (
            f"`dots` takes {dots[0]:.2f}-{dots[1]:.2f}x no remat's step time and `full` "
            f"{full[0]:.2f}-{full[1]:.2f}x",
        ),
        "docs/speed.md (profile_remat)",
    )
