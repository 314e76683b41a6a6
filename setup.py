"""gdpo_jax: GDPO / GRPO multi-reward RL for language models in JAX + Flax NNX."""

from setuptools import find_packages, setup

# Exact pins: the versions the test suite was run with. jax and flax move fast
# and break each other; bump them together and re-run `make test`.
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "chex==0.1.92",
    "ml_collections==1.1.0",
    "absl-py==2.5.1",
    "numpy==2.4.6",
    # jax's dtype extension (jax allows >=0.5.0), pinned below its newest: 0.7.0's
    # import took about a second beside numpy 2.4.6 (registering its ufunc loops), which
    # every process importing jax paid (each CLI start, each test subprocess); 0.6.0's
    # is a fraction of it (benchmarks/profile_import.py, docs/benchmarks.md).
    "ml_dtypes==0.6.0",
    "transformers==5.23.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "gguf==0.19.0",
    "grain==0.2.18",
    "datasets==5.2.0",
    "pyarrow==26.0.1",
    "math-verify==0.9.0",
    "tensorboardX==2.6.5",
    "matplotlib==3.11.2",
    "tqdm==4.70.1",
]

EXTRAS = {
    # torch is a *reference* only (logits parity, side-by-side benchmarks).
    "test": [
        "pytest==9.2.0",
        "pytest-xdist==3.8.0",
        "filelock==4.3.2",  # tests/_once.py: a module fixture once a session across workers
        "hypothesis==6.170.15",
        "nbmake==1.5.5",
        "ipykernel==7.4.0",
        "torch==2.13.0",
        "ruff==0.17.6",  # `make lint` (settings in pyproject.toml)
    ],
    "bench": ["torch==2.13.0", "trl==1.16.0"],
    # The viewers the docs use: `tensorboard --logdir <workdir>/tb` and
    # `jupyter nbconvert --execute` (ipykernel runs the notebooks). `make install`.
    "viz": ["tensorboard==2.21.0", "nbconvert==7.17.2", "ipykernel==7.4.0"],
    # Accelerator runtimes, matching jax==0.10.2 (jax pins libtpu 0.0.42.*).
    "cuda12": ["jax[cuda12]==0.10.2"],
    "tpu": ["jax[tpu]==0.10.2"],
    # Ahead-of-time planning on a CPU machine (experiments/plan.py): libtpu and
    # the CUDA 12 compiler plugin, without the CUDA runtime wheels; cuDNN, because a
    # GPU run in bf16 uses cuDNN flash attention and lowering that kernel loads cuDNN
    # (without it the planner plans the XLA kernel instead, and says so). Every JAX
    # process in such an environment must run with JAX_PLATFORMS=cpu.
    "aot": [
        "jax[tpu]==0.10.2",
        "jax-cuda12-plugin==0.10.2",
        "jax-cuda12-pjrt==0.10.2",
        "nvidia-cudnn-cu12==9.28.0.42",
    ],
}
EXTRAS["dev"] = sorted(set(EXTRAS["test"] + EXTRAS["bench"] + EXTRAS["viz"]))

# Console scripts; they work from any directory: `--config=configs/x.py` is the
# caller's file when it exists, else the installed `configs` package's.
CONSOLE_SCRIPTS = [
    "gdpo-train=experiments.train:run",
    "gdpo-sft=experiments.sft:run",
    "gdpo-compare=experiments.compare_estimators:run",
]

# Directories of shipped files (sample datasets; XLA's GPU target descriptions).
DATA_PACKAGES = ["gdpo_jax.data.samples", "gdpo_jax.scale.gpu_specs"]

setup(
    name="gdpo_jax",
    version="0.1.0",
    description="GDPO (group reward-decoupled normalization) and GRPO for LLM RL in JAX/Flax NNX",
    # configs/ and experiments/ ship too: the console scripts and `configs.<name>`
    # imports between config files need them outside the repository.
    # The two data directories are listed as packages of their own (they have no
    # __init__.py): setuptools treats every shipped directory as a package and warns
    # that it may stop shipping one that is missing from this list.
    packages=find_packages(include=["gdpo_jax", "gdpo_jax.*", "configs", "experiments"])
    + DATA_PACKAGES,
    entry_points={"console_scripts": CONSOLE_SCRIPTS},
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    package_data={
        "gdpo_jax.data.samples": ["*.jsonl", "*.parquet"],
        "gdpo_jax.scale.gpu_specs": ["*.txtpb"],
    },
    include_package_data=True,
)
