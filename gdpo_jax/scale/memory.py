"""A program's memory per device: bytes of sharded arrays, the compiler's figures for a
compiled program, and the bytes a TPU compile's out-of-memory error names."""

from __future__ import annotations

import math
import re
import time
from typing import Any

import jax
import jax.numpy as jnp

from gdpo_jax.scale.targets import GIB

__all__ = ["compile_memory", "memory_figures", "oom_bytes", "per_device_bytes"]


def per_device_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of sharded ShapeDtypeStructs (the largest shard)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
    return int(total)


# libtpu's two ways of saying "over HBM": "Used 120.5G of 95.74G hbm" and "the total
# memory required for HLO temporaries (30.31G) exceeds available HBM (15.75G)".
_OOM = (
    re.compile(r"Used ([\d.]+)([KMGT]) of [\d.]+[KMGT] hbm", re.I),
    re.compile(r"\(([\d.]+)([KMGT])\) exceeds available HBM", re.I),
)
_UNIT = {"K": 1024, "M": 1024**2, "G": GIB, "T": 1024**4}


def oom_bytes(msg: str) -> int:
    """The bytes a RESOURCE_EXHAUSTED compile error says the program needs (0 if unsaid)."""
    for pat in _OOM:
        m = pat.search(msg)
        if m:
            return int(float(m.group(1)) * _UNIT[m.group(2).upper()])
    return 0


def compile_memory(lower_fn: Any) -> dict[str, Any]:
    """Compiles; returns the compiler's per-device memory figures (or its OOM verdict)."""
    t0 = time.perf_counter()
    try:
        compiled = lower_fn().compile()
    except Exception as e:  # noqa: BLE001 - XLA raises XlaRuntimeError / JaxRuntimeError
        msg = str(e)
        if "RESOURCE_EXHAUSTED" not in msg and "exceeds" not in msg.lower():
            raise
        used = oom_bytes(msg)
        return dict(
            compiled=False,
            compiler_fits=False,
            error=msg.splitlines()[0][:300],
            program_bytes=used,
            args=0,
            outputs=0,
            aliased=0,
            temps=used,
            compile_s=time.perf_counter() - t0,
        )
    return dict(
        compiled=True,
        compiler_fits=True,
        **memory_figures(compiled),
        compile_s=time.perf_counter() - t0,
    )


def memory_figures(compiled: Any) -> dict[str, int]:
    """A compiled program's bytes per device from `memory_analysis()`: args, outputs,
    aliased (outputs written into donated args), temps, code and program_bytes
    (args + outputs - aliased + temps + code: what it needs while it runs)."""
    ma = compiled.memory_analysis()
    args, outs = int(ma.argument_size_in_bytes), int(ma.output_size_in_bytes)
    alias, temps = int(ma.alias_size_in_bytes), int(ma.temp_size_in_bytes)
    code = int(getattr(ma, "generated_code_size_in_bytes", 0) or 0)
    return dict(
        args=args,
        outputs=outs,
        aliased=alias,
        temps=temps,
        code=code,
        program_bytes=args + outs - alias + temps + code,
    )
