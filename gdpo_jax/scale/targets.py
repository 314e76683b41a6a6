"""Where a run could go: the one table of TPU slices and GPU clusters, and their chips.

A target is a set of *abstract* devices (no hardware needed) for which XLA
compiles real TPU or GPU programs on a CPU machine:

  * TPU: `jax.experimental.topologies.get_topology_desc(platform="tpu",
    topology_name="v5p:2x2x2")` through libtpu (the `[tpu]` / `[aot]` extra);
  * GPU: the CUDA plugin (`[cuda12]` / `[aot]`) with a GpuTargetConfigProto text
    proto describing the card (gpu_specs/*.txtpb, from openxla/xla) and a
    "<slices>x<hosts>x<gpus>" topology.

Names: `v5p-16` (Cloud TPU naming: the number counts TensorCores, 2 per v4 /
v5p chip, 1 per v5e / v6e chip), `8xh100`, and the raw forms
`tpu:<topology>[,slices=N]` and `cuda:<slices>x<hosts>x<gpus>:<card>`.

Chip figures (per chip; dense bf16 peak, HBM bandwidth) are the vendors'
published numbers: Cloud TPU system-architecture pages (v4 275 TF/s 1.2 TB/s
32 GiB; v5e 197 TF/s 819 GB/s 16 GiB; v5p 459 TF/s 2.76 TB/s 95 GiB; v6e 918 TF/s
1.64 TB/s 32 GiB) and NVIDIA datasheets (A100 312 TF/s, H100 / H200 SXM 989 TF/s
dense); GPU memory size and bandwidth come from the target proto itself.

What a run's programs may use per device (`Target.usable_bytes`) is less than
the nominal memory: on a TPU, the HBM libtpu makes available to a program
(`Chip.usable_bytes`: the "exceeds available HBM (15.75G)" figure of its
RESOURCE_EXHAUSTED messages, which test_scale_plan reproduces per chip); on a
GPU, the pool a run with XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 gives XLA, and at
most the card less GPU_RUNTIME_RESERVE_BYTES.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any

GIB = 1024**3
_SPEC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_specs")
# The share of a GPU's memory a run gives XLA's pool (runs set
# XLA_PYTHON_CLIENT_MEM_FRACTION=0.95; XLA's own default is 0.75), and the memory
# a GPU process cannot give to XLA's programs whatever the fraction: CUDA context,
# cuBLAS / cuDNN workspaces, NCCL buffers, fragmentation. A program's total is
# compared with the smaller of the two limits (the reserve binds on 80 GB cards,
# the fraction on an H200).
GPU_MEM_FRACTION = 0.95
GPU_RUNTIME_RESERVE_BYTES = 4 * GIB


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator. memory_bytes: HBM per chip (nominal); peak_flops: dense bf16
    FLOP/s; hbm_bw: bytes/s; spec: GPU target proto file in gpu_specs/ ("" for TPUs);
    hbm_available: a TPU's HBM that libtpu lets a program use (0 for GPUs)."""

    name: str
    platform: str  # "tpu" | "cuda"
    memory_bytes: int
    peak_flops: float
    hbm_bw: float
    spec: str = ""
    tpu_prefix: str = ""  # the topology-name prefix libtpu expects ("v5p")
    # libtpu's chip_config_name. A v4 chip's two TensorCores are one JAX device
    # ("megacore", as JAX runs a v4 slice); libtpu's default describes each core.
    tpu_chip_config: str = ""
    hbm_available: int = 0


# libtpu's available HBM per chip, as its compiler's out-of-memory message states it
# ("... exceeds available HBM (15.75G)", G = GiB, two decimals; libtpu of the [aot]
# extra, reproduced by test_scale_plan.py::test_tpu_usable_hbm_is_libtpus_available_hbm).
# Below the nominal size on v4 / v5e / v6e; above the nominal 95 GiB on a v5p.
def _libtpu_gib(gib: float) -> int:
    return int(round(gib * GIB))


CHIPS: dict[str, Chip] = {
    "v4": Chip(
        "TPU v4",
        "tpu",
        32 * GIB,
        275e12,
        1.2e12,
        tpu_prefix="v4",
        tpu_chip_config="megacore",
        hbm_available=_libtpu_gib(30.75),
    ),
    "v5e": Chip(
        "TPU v5e",
        "tpu",
        16 * GIB,
        197e12,
        0.819e12,
        tpu_prefix="v5e",
        hbm_available=_libtpu_gib(15.75),
    ),
    "v5p": Chip(
        "TPU v5p",
        "tpu",
        95 * GIB,
        459e12,
        2.765e12,
        tpu_prefix="v5p",
        hbm_available=_libtpu_gib(95.74),
    ),
    "v6e": Chip(
        "TPU v6e",
        "tpu",
        32 * GIB,
        918e12,
        1.64e12,
        tpu_prefix="v6e",
        hbm_available=_libtpu_gib(31.25),
    ),
    # Memory and bandwidth of the GPUs: device_memory_size / memory_bandwidth of the proto.
    "h100": Chip("NVIDIA H100 SXM 80GB", "cuda", 84942979072, 989e12, 3.35232e12, "h100_sxm"),
    "h200": Chip("NVIDIA H200 141GB", "cuda", 151397597184, 989e12, 4.8e12, "h200"),
    "a100-80g": Chip(
        "NVIDIA A100 SXM 80GB", "cuda", 85100068864, 312e12, 2.03904e12, "a100_sxm_80"
    ),
}


@dataclasses.dataclass(frozen=True)
class Target:
    """A named slice / cluster: `chip` x `num_devices`, and how to ask XLA for it.

    topology: libtpu topology name ("v5p:2x2x2") or the CUDA "SxHxG" string.
    num_hosts: the machines (TPU VMs, GPU hosts) over all slices, one JAX process
    each (`tpu_hosts`; S x H for a GPU "SxHxG").
    """

    name: str
    chip: Chip
    topology: str
    num_slices: int = 1
    num_hosts: int = 1

    @property
    def platform(self) -> str:
        return self.chip.platform

    @property
    def num_devices(self) -> int:
        if self.platform == "cuda":
            s, h, g = (int(x) for x in self.topology.split("x"))
            return s * h * g
        dims = self.topology.split(":", 1)[1].split("x")
        n = 1
        for d in dims:
            n *= int(d)
        return n * self.num_slices

    @property
    def usable_bytes(self) -> int:
        """Memory a run's programs may use per device: a TPU's HBM as libtpu makes it
        available; a GPU's XLA_PYTHON_CLIENT_MEM_FRACTION share of the card, at most
        the card less the runtime reserve."""
        if self.platform == "tpu":
            return self.chip.hbm_available
        mem = self.chip.memory_bytes
        return min(mem - GPU_RUNTIME_RESERVE_BYTES, int(GPU_MEM_FRACTION * mem))

    def describe(self) -> str:
        slices = (
            f" x {self.num_slices} slices" if self.platform == "tpu" and self.num_slices > 1 else ""
        )
        return f"{self.num_devices} x {self.chip.name} ({self.topology}{slices})"


def tpu_hosts(prefix: str, chips: int) -> int:
    """TPU VMs (hosts, one JAX process each) of one slice of `chips` chips.

    Cloud TPU system-architecture pages: a v4 or v5p VM holds 4 chips (v5p-8 =
    2x2x1 is one VM, 2x2x2 two); a v5e / v6e slice of up to 8 chips (1x1, 2x2,
    2x4) is one VM of 1, 4 or 8 chips (ct5lp-hightpu-8t, ct6e-standard-8t), a
    larger one is made of 4-chip VMs (v5e / v6e 4x4 = 4 VMs; those pages' "Hosts"
    column counts the 8-chip machines under them, 2 for a 4x4, but each VM is a
    host to JAX).
    """
    if prefix in ("v5e", "v6e") and chips <= 8:
        return 1
    return -(-chips // 4)


def _tpu_target(name: str, chip: Chip, topology: str, slices: int = 1) -> Target:
    chips = math.prod(int(d) for d in topology.split(":", 1)[1].split("x"))
    hosts = slices * tpu_hosts(chip.tpu_prefix, chips)  # each slice its own VMs
    return Target(name, chip, topology, num_slices=slices, num_hosts=hosts)


def _tpu(name: str, chip: str, topo: str) -> Target:
    return _tpu_target(name, CHIPS[chip], f"{CHIPS[chip].tpu_prefix}:{topo}")


def _gpu(name: str, chip: str, hosts: int, gpus: int) -> Target:
    return Target(name, CHIPS[chip], f"1x{hosts}x{gpus}", num_hosts=hosts)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        _tpu("v4-8", "v4", "2x2x1"),
        _tpu("v4-16", "v4", "2x2x2"),
        _tpu("v5e-4", "v5e", "2x2"),
        _tpu("v5e-8", "v5e", "2x4"),
        _tpu("v5e-16", "v5e", "4x4"),
        _tpu("v5e-32", "v5e", "4x8"),
        _tpu("v5p-8", "v5p", "2x2x1"),
        _tpu("v5p-16", "v5p", "2x2x2"),
        _tpu("v5p-32", "v5p", "2x2x4"),
        _tpu("v5p-64", "v5p", "2x4x4"),
        _tpu("v5p-128", "v5p", "4x4x4"),
        _tpu("v6e-8", "v6e", "2x4"),
        _tpu("v6e-16", "v6e", "4x4"),
        _gpu("1xh100", "h100", 1, 1),
        _gpu("8xh100", "h100", 1, 8),
        _gpu("16xh100", "h100", 2, 8),
        _gpu("32xh100", "h100", 4, 8),
        _gpu("8xa100-80g", "a100-80g", 1, 8),
        _gpu("16xa100-80g", "a100-80g", 2, 8),
        _gpu("1xh200", "h200", 1, 1),
        _gpu("8xh200", "h200", 1, 8),
    )
}
RAW_FORMS = (
    "tpu:<topology>[,slices=N]  e.g. tpu:v5p:2x4x4,slices=2",
    "cuda:<slices>x<hosts>x<gpus>:<card>  e.g. cuda:1x2x8:h100",
)


class TargetError(ValueError):
    """Unknown target name; the message lists the valid ones."""


def valid_names() -> str:
    gpus = sorted(k for k, c in CHIPS.items() if c.platform == "cuda")
    return (
        f"known targets: {', '.join(TARGETS)}; raw forms: {'; '.join(RAW_FORMS)} "
        f"(TPU chips {', '.join(k for k, c in CHIPS.items() if c.platform == 'tpu')}; "
        f"GPU cards {', '.join(gpus)})"
    )


def parse_target(name: str) -> Target:
    """A Target from a table name or a raw `tpu:` / `cuda:` form; TargetError otherwise."""
    name = (name or "").strip()
    if name in TARGETS:
        return TARGETS[name]
    m = re.fullmatch(r"tpu:((v4|v5e|v5p|v6e):\d+(?:x\d+){1,2})(?:,slices=(\d+))?", name)
    if m:
        dims = m.group(1).split(":")[1].split("x")
        _check_counts(name, [*dims, m.group(3) or "1"])
        want = (
            2 if m.group(2) in ("v5e", "v6e") else 3
        )  # the chips' interconnect: a 2-D or 3-D torus
        if len(dims) != want:
            # libtpu compiled for tpu:v5e:2x2x2 all the same, and the plan "fit" a slice
            # that cannot exist.
            raise TargetError(
                f"--topology={name!r}: a {m.group(2)} slice is {want}-D ({'x'.join(['N'] * want)}, "
                f"e.g. tpu:{m.group(2)}:{'x'.join(['2'] * want)}), not {len(dims)}-D."
            )
        chip = next(c for c in CHIPS.values() if c.tpu_prefix == m.group(2))
        return _tpu_target(name, chip, m.group(1), int(m.group(3) or 1))
    m = re.fullmatch(r"cuda:(\d+)x(\d+)x(\d+):([\w.-]+)", name)
    if m and m.group(4) in CHIPS and CHIPS[m.group(4)].platform == "cuda":
        _check_counts(name, m.group(1, 2, 3))
        s, h, g = (int(m.group(i)) for i in (1, 2, 3))
        return Target(name, CHIPS[m.group(4)], f"{s}x{h}x{g}", num_slices=s, num_hosts=s * h)
    raise TargetError(f"--topology={name!r} is not a known target; {valid_names()}.")


def _check_counts(name: str, counts: Any) -> None:
    """A count of 0 (chips, hosts, GPUs, slices) made a target of no devices, which
    failed deep in validation with a ZeroDivisionError."""
    if any(int(c) < 1 for c in counts):
        raise TargetError(
            f"--topology={name!r} has a count of 0; every slice, host, GPU and chip "
            "dimension is >= 1, e.g. tpu:v5p:2x4x4,slices=2 or cuda:1x2x8:h100."
        )


class MissingExtraError(RuntimeError):
    """The compiler plugin for a target's platform is not installed."""


def has_module(name: str) -> bool:
    """Whether `name` can be imported (a missing parent package counts as missing)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _check_plugin(platform: str) -> None:
    if platform == "tpu" and not has_module("libtpu"):
        raise MissingExtraError(
            'planning for a TPU target needs libtpu: pip install -e ".[aot]" (or ".[tpu]").'
        )
    if platform == "cuda" and not has_module("jax_plugins.xla_cuda12"):
        raise MissingExtraError(
            'planning for a GPU target needs the CUDA plugin: pip install -e ".[aot]" '
            '(or ".[cuda12]").'
        )


def gpu_target_config(chip: Chip) -> str:
    """The GpuTargetConfigProto text of a GPU chip (comments stripped)."""
    with open(os.path.join(_SPEC_DIR, chip.spec + ".txtpb")) as f:
        return "".join(line for line in f if not line.lstrip().startswith("#"))


def target_devices(target: Target) -> list[Any]:
    """Abstract devices of `target` (compile-only: nothing runs, nothing is allocated).

    Needs JAX_PLATFORMS=cpu when libtpu is installed on a machine without TPUs.
    """
    _check_plugin(target.platform)
    from jax.experimental import topologies

    if target.platform == "tpu":
        chip = target.chip.tpu_chip_config
        topo = topologies.get_topology_desc(
            platform="tpu",
            topology_name=target.topology,
            num_slices=target.num_slices,
            **({"chip_config_name": chip} if chip else {}),
        )
    else:
        topo = topologies.get_topology_desc(
            "",
            platform="cuda",
            topology=target.topology,
            target_config=gpu_target_config(target.chip),
        )
    devices = list(topo.devices)
    if len(devices) != target.num_devices:
        raise RuntimeError(
            f"target {target.name}: expected {target.num_devices} devices, XLA gave {len(devices)}."
        )
    return devices
