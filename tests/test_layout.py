"""The package layout stays: no import cycle inside gdpo_jax/, no import from a lower layer
to a higher one.

Every module under gdpo_jax/ is parsed with `ast` (imports inside functions
count too: a lazy import is still a dependency). An import names the most
specific module it reaches: `from gdpo_jax.train import mesh` is an edge to
`gdpo_jax.train.mesh`, `from gdpo_jax.sampling import Sampler` one to the
package `gdpo_jax.sampling` (its __init__). The implicit import of parent
packages is not an edge.

Layers, lowest first, follow the data's path read from the bottom up: leaf
helpers, the pure maths, the model, the sampler, the data, the rewards, the
tasks, then the trainer (config and mesh < the parts of a step < the drivers that wire
config -> loop -> sampler -> rewards -> compiled step -> metrics/checkpoint),
and analysis / planning on top. A module may import its own layer or lower.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterable

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "gdpo_jax"

# (layer, module prefixes), lowest layer first. A module belongs to the layer of
# its longest matching prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "leaf",
        (
            "gdpo_jax.sharding",
            "gdpo_jax.multihost",
            "gdpo_jax.errors",
            "gdpo_jax.hostenv",
            "gdpo_jax.backend",
            "gdpo_jax.compile_cache",
            "gdpo_jax.quiet_start",
            "gdpo_jax.xla_cpu",
            "gdpo_jax.lazy_exports",
        ),
    ),
    ("core", ("gdpo_jax.core",)),
    ("models", ("gdpo_jax.models",)),
    ("sampling", ("gdpo_jax.sampling",)),
    ("data", ("gdpo_jax.data",)),
    ("rewards", ("gdpo_jax.rewards",)),
    ("tasks", ("gdpo_jax.tasks",)),
    # config, the mesh helpers it validates against (a re-export of the leaf) and
    # the workdir/path helpers (local or URL) it checks inputs with.
    (
        "train.base",
        (
            "gdpo_jax.train.config",
            "gdpo_jax.train.field_checks",
            "gdpo_jax.train.schema",
            "gdpo_jax.train.reward_setup",
            "gdpo_jax.train.mesh",
            "gdpo_jax.train.paths",
        ),
    ),
    (
        "train.parts",
        (
            "gdpo_jax.train.state",
            "gdpo_jax.train.metrics",
            "gdpo_jax.train.distributed",
            "gdpo_jax.train.step",
            "gdpo_jax.train.step_config",
            "gdpo_jax.train.step_metrics",
            "gdpo_jax.train.blocks",
            "gdpo_jax.train.completion",
            "gdpo_jax.train.layer_views",
            "gdpo_jax.train.rollout",
            "gdpo_jax.train.sample_score",
            "gdpo_jax.train.checkpoint",
            "gdpo_jax.train.checkpoint_errors",
            "gdpo_jax.train.resume_checks",
            "gdpo_jax.train.orbax_noise",
            "gdpo_jax.train.preemption",
            "gdpo_jax.train.build",
            "gdpo_jax.train.records",
        ),
    ),
    ("train.drivers", ("gdpo_jax.train",)),  # loop, sft, the package __init__
    ("top", ("gdpo_jax.analysis", "gdpo_jax.scale", "gdpo_jax")),
]

# Known violations, as (importer, imported) edges, each skipped by the tests below.
# Empty since the task move (issue #15 phase B); keep it so. The old-path shims
# (gdpo_jax.train.toy_task / tasks_adapter / data) import downward, so need no entry.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()

Edges = dict[str, dict[str, int]]  # importer -> {imported: first line}


def module_files(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every .py under `root` (packages by __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph(files: dict[str, pathlib.Path]) -> Edges:
    """importer -> {imported module: line} over modules of `files` (self-imports dropped)."""

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: Edges = {}
    for mod, path in files.items():
        edges: dict[str, int] = {}
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                hit = resolve(t)
                if hit and hit != mod:
                    edges.setdefault(hit, node.lineno)
        graph[mod] = edges
    return graph


def layer_of(mod: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> int:
    """Index of `mod`'s layer (longest matching prefix); KeyError if none matches."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    if best is None:
        raise KeyError(mod)
    return best


def upward_imports(
    graph: Edges, layers: list[tuple[str, tuple[str, ...]]] = LAYERS
) -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import from a lower layer to a higher one."""
    return sorted(
        (a, b, line)
        for a, deps in graph.items()
        for b, line in deps.items()
        if layer_of(a, layers) < layer_of(b, layers)
    )


def find_cycles(graph: Edges, skip: Iterable[tuple[str, str]] = ()) -> list[list[str]]:
    """One cycle [m0, m1, ..., m0] per strongly connected component with > 1 module
    (Tarjan), ignoring the `skip` edges."""
    skip = set(skip)
    adj = {a: sorted(b for b in deps if (a, b) not in skip) for a, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(adj):
        if v not in index:
            visit(v)
    return [_cycle_in(comp, adj) for comp in comps]


def _cycle_in(comp: list[str], adj: dict[str, list[str]]) -> list[str]:
    """A concrete cycle through comp[0], by breadth-first search inside the component."""
    start, members = comp[0], set(comp)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in adj.get(v, ()):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start] + path[::-1][1:] + [start]
                if w in members and w not in parent and w != start:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {comp}")  # a component always has one


def _chain(cycle: list[str], graph: Edges, files: dict[str, pathlib.Path]) -> str:
    return "\n".join(
        f"  {a} -> {b}   ({files[a].relative_to(ROOT.parent)}:{graph[a][b]})"
        for a, b in zip(cycle, cycle[1:])
    )


@pytest.fixture(scope="module")
def graph_and_files() -> tuple[Edges, dict[str, pathlib.Path]]:
    files = module_files()
    return import_graph(files), files


def test_every_module_has_a_layer(graph_and_files):
    _, files = graph_and_files
    missing = []
    for mod in files:
        try:
            layer_of(mod)
        except KeyError:
            missing.append(mod)
    assert not missing, f"modules without a layer (add them to LAYERS): {missing}"


def test_no_import_cycles(graph_and_files):
    graph, files = graph_and_files
    cycles = find_cycles(graph, skip=KNOWN_VIOLATIONS)
    msg = "\n\n".join("import cycle:\n" + _chain(c, graph, files) for c in cycles)
    assert not cycles, msg


def test_no_upward_imports(graph_and_files):
    graph, files = graph_and_files
    bad = [(a, b, n) for a, b, n in upward_imports(graph) if (a, b) not in KNOWN_VIOLATIONS]
    names = [name for name, _ in LAYERS]
    msg = "\n".join(
        f"  {a} [{names[layer_of(a)]}] imports {b} [{names[layer_of(b)]}]   "
        f"({files[a].relative_to(ROOT.parent)}:{n})"
        for a, b, n in bad
    )
    assert not bad, f"imports from a lower layer to a higher one:\n{msg}"


def test_known_violations_are_still_real(graph_and_files):
    # Keeps the set honest: a fixed violation must leave it (so it cannot come back).
    graph, _ = graph_and_files
    stale = sorted((a, b) for a, b in KNOWN_VIOLATIONS if b not in graph.get(a, {}))
    assert not stale, f"fixed, remove from KNOWN_VIOLATIONS in tests/test_layout.py: {stale}"


def test_checker_catches_a_cycle_and_an_upward_import(tmp_path):
    # The checker itself can fail: a synthetic package with both faults.
    pkg = tmp_path / "gdpo_jax"
    (pkg / "core").mkdir(parents=True)
    (pkg / "train").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "train" / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("def f():\n    from gdpo_jax.train import b\n")
    (pkg / "train" / "b.py").write_text("from ..core import a\n")
    files = module_files(pkg)
    graph = import_graph(files)
    assert graph["gdpo_jax.core.a"] == {"gdpo_jax.train.b": 2}
    assert graph["gdpo_jax.train.b"] == {"gdpo_jax.core.a": 1}
    assert find_cycles(graph) == [["gdpo_jax.core.a", "gdpo_jax.train.b", "gdpo_jax.core.a"]]
    assert upward_imports(graph) == [("gdpo_jax.core.a", "gdpo_jax.train.b", 2)]
    assert find_cycles(graph, skip={("gdpo_jax.core.a", "gdpo_jax.train.b")}) == []
