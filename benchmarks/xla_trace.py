"""Reading a jax.profiler trace and the optimized HLO it ran: the profilers' shared part.

A trace (``jax.profiler.start_trace(dir, create_perfetto_trace=True)``) names
each XLA:CPU operation by its HLO instruction (``ynn_fusion.3``). The optimized
HLO that XLA dumps with ``--xla_dump_to`` gives each instruction its output
shape, its operands and the jax operation it comes from (``op_name``
metadata: a dot's einsum spec, ``transpose``, ``reduce_max``, ...).
profile_decode_ops and profile_step_ops join the two by instruction name;
profile_step and profile_decode read only the trace (``op_breakdown``).
"""

from __future__ import annotations

import collections
import contextlib
import glob
import gzip
import json
import math
import os
import pathlib
import re
import tempfile
from collections.abc import Iterator
from typing import NamedTuple

__all__ = [
    "Instr",
    "dot_flops",
    "hlo_dump",
    "instructions",
    "kind_of",
    "module_hlo",
    "op_breakdown",
    "op_calls",
    "op_ms",
    "op_ms_shared",
    "op_times",
    "other_kinds",
    "rates",
]

# `%name = f32[1024,256]{1,0} fusion(%a, %b), kind=..., metadata={op_name="..."}`
_INSTR = re.compile(
    r"^\s*(?:ROOT )?%?([\w.\-]+) = \w+\[([\d,]*)\]\S* ([\w\-]+)\(([^)]*)\)"
    r"(?:[^\n]*?op_name=\"([^\"]*)\")?"
)
_OPERAND = re.compile(r"%([\w.\-]+)")


class Instr(NamedTuple):
    """One instruction of an optimized HLO module's text."""

    dims: tuple[int, ...]  # output shape (() for a scalar or a tuple)
    opcode: str  # "fusion", "dot", "copy", ...
    operands: tuple[str, ...]  # operand instruction names
    op_name: str  # the jax operation's name path ("" without metadata)


def _events(trace_dir: str) -> list[tuple[str, float, float]]:
    """(HLO instruction name, start ms, ms) of each operation event in the trace under
    trace_dir; the executor's, Python's and loops' frames (which nest the operations)
    skipped."""
    path = glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "perfetto_trace.json.gz"))
    with gzip.open(path[0]) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    out = []
    for e in events:
        name = e.get("name", "")
        if e.get("ph") != "X" or name.startswith(("ThunkExecutor", "$", "while", "Slinky")):
            continue
        # A C++ qualified name ("CommonPjRtLoadedExecutable::Execute...") is a host frame.
        if "::" in name or name.startswith(("PjitFunction", "np.asarray")):
            continue
        out.append((name, e.get("ts", 0) / 1e3, e.get("dur", 0) / 1e3))
    return out


def op_ms(trace_dir: str) -> collections.Counter:
    """Milliseconds by XLA:CPU operation (its HLO instruction name), summed over the
    trace's events."""
    return _summed(_events(trace_dir))


def _summed(events: list[tuple[str, float, float]]) -> collections.Counter:
    total: collections.Counter = collections.Counter()
    for name, _, ms in events:
        total[name] += ms
    return total


def op_ms_shared(trace_dir: str) -> collections.Counter:
    """Milliseconds by operation with concurrent operations sharing the time: each
    instant that k operations run at once adds 1/k of it to each. XLA:CPU runs
    independent operations side by side (two products of one input, say), where
    summed durations count the shared cores twice; these sum to the time during
    which any operation runs."""
    return _shared(_events(trace_dir))


def _shared(events: list[tuple[str, float, float]]) -> collections.Counter:
    edges = []
    for i, (_, start, ms) in enumerate(events):
        edges += [(start, 1, i), (start + ms, -1, i)]
    total: collections.Counter = collections.Counter()
    active: set[int] = set()
    last = 0.0
    for t, kind, i in sorted(edges, key=lambda e: (e[0], e[1])):  # ends before starts
        for j in active:
            total[events[j][0]] += (t - last) / len(active)
        last = t
        if kind > 0:
            active.add(i)
        else:
            active.discard(i)
    return total


def op_times(trace_dir: str) -> tuple[collections.Counter, ...]:
    """(`op_ms_shared`, `op_ms`, `op_calls`) from one read of the trace."""
    events = _events(trace_dir)
    return _shared(events), _summed(events), collections.Counter(n for n, _, _ in events)


def op_calls(trace_dir: str) -> collections.Counter:
    """How many times each XLA:CPU operation ran in the trace."""
    return collections.Counter(name for name, _, _ in _events(trace_dir))


def kind_of(name: str) -> str:
    """An instruction's kind: its name without the numeric suffix ("ynn_fusion.3")."""
    return re.sub(r"\.\d+$", "", name)


def op_breakdown(trace_dir: str, steps: int, top: int = 8) -> dict[str, float]:
    """Milliseconds per step by operation kind, the `top` largest."""
    total: collections.Counter = collections.Counter()
    for name, ms in op_ms(trace_dir).items():
        total[kind_of(name)] += ms / steps
    return {k: round(v, 1) for k, v in total.most_common(top)}


def other_kinds(
    op_ms: dict[str, float], categories: dict[str, str], steps: int, top: int = 4
) -> dict[str, float]:
    """The `top` largest operation kinds among the operations in category "other" (or
    not named by `categories`), milliseconds per step."""
    total: collections.Counter = collections.Counter()
    for name, ms in op_ms.items():
        if categories.get(name, "other") == "other":
            total[kind_of(name)] += ms / steps
    return {k: round(v, 3) for k, v in total.most_common(top)}


def instructions(hlo: str) -> dict[str, Instr]:
    """{instruction name: Instr} for every instruction line of an HLO module's text."""
    out = {}
    for line in hlo.splitlines():
        m = _INSTR.match(line)
        if m:
            name, dims, opcode, operands, op_name = m.groups()
            shape = tuple(int(d) for d in dims.split(",")) if dims else ()
            out[name] = Instr(shape, opcode, tuple(_OPERAND.findall(operands)), op_name or "")
    return out


def dot_flops(instr: Instr, table: dict[str, Instr]) -> int | None:
    """FLOPs of a two-operand matrix product without batch dimensions, from shapes
    alone: for A[M, K] @ B[K, N] = C[M, N], |A| |B| / |C| = K², so 2 |C| K.
    None when it is not one (another operand count, or |A| |B| / |C| not a square)."""
    if len(instr.operands) != 2 or any(o not in table for o in instr.operands):
        return None
    a, b = (math.prod(table[o].dims) for o in instr.operands)
    c = math.prod(instr.dims)
    k = math.isqrt(a * b // c) if c and a * b % c == 0 else 0
    return 2 * c * k if k and k * k * c == a * b else None


def rates(
    op_ms: dict[str, float],
    calls: dict[str, int],
    categories: dict[str, str],
    hlo: str,
    wanted: set[str],
) -> dict[str, float]:
    """GFLOP/s of each category in `wanted` (plain products: `dot_flops`) over the
    milliseconds of its operations whose FLOPs are known (`calls`: how often each ran)."""
    table = instructions(hlo)
    flops: collections.Counter = collections.Counter()
    ms: collections.Counter = collections.Counter()
    for name, t in op_ms.items():
        cat = categories.get(name)
        f = dot_flops(table[name], table) if cat in wanted else None
        if f is not None:
            flops[cat] += f * calls.get(name, 0)
            ms[cat] += t
    return {k: round(flops[k] / ms[k] / 1e6, 1) for k in flops if ms[k]}


@contextlib.contextmanager
def hlo_dump(module: str, prefix: str = "hlo_dump_") -> Iterator[str]:
    """A temporary directory that XLA dumps the optimized HLO of the modules whose name
    holds `module` into: XLA_FLAGS gets ``--xla_dump_to``, so enter this before JAX
    starts its backend (XLA reads its flags then), in a script's own process."""
    with tempfile.TemporaryDirectory(prefix=prefix) as dump:
        flags = f"--xla_dump_to={dump} --xla_dump_hlo_module_re=.*{module}.*"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
        yield dump


def module_hlo(dump_dir: str, module: str, names: set[str]) -> str:
    """The optimized HLO text, among the dumped modules whose name holds `module`,
    that names most of the traced operations `names`."""
    paths = glob.glob(os.path.join(dump_dir, f"*{module}*after_optimizations.txt"))
    if not paths:
        raise RuntimeError(
            f"no optimized HLO of {module!r} under {dump_dir}: XLA_FLAGS must hold "
            f"--xla_dump_to={dump_dir} before JAX starts its backend (run this as a script)."
        )
    texts = [pathlib.Path(p).read_text() for p in paths]
    return max(texts, key=lambda t: sum(f"%{n} " in t for n in names))
