"""Test session set-up: 8 fake CPU devices so sharding tests run anywhere.

XLA reads the flag once, when the backend starts, so it is set here, before any
test module imports jax.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu (the [aot] extra) is only a compiler here, with no TPU chip to guard: let
# concurrent processes (pytest-xdist workers, a planner run) each load it.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
