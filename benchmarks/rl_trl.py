"""bench_rl's TRL side: GRPOTrainer on the same checkpoint, prompts and rewards,
timed per iteration (sample / reward / step), in a child process whose
environment lacks gdpo_jax's malloc tunable.

    python -m benchmarks.rl_trl CKPT OUT.json --beta B --warmup W --iters I \
        [--device cpu|cuda] [--model tiny|smollm2]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

from benchmarks import common
from benchmarks.rl_setup import REWARDS, SHAPES, TINY, Shape, prompts


def trl_args(shape: Shape, beta: float, steps: int, device: str = "cpu") -> dict[str, Any]:
    """GRPOConfig's arguments for TRL's side: the same work as ours (f32, the same
    sampling, GDPO's normalize_then_sum, the per-sequence "grpo" loss).

    gradient_checkpointing=False: TRL 1.16 turns it on by default, and each backward
    then re-ran every decoder layer's forward, which ours (model.remat=False) does not:
    the runs before this was set did more work on TRL's side.
    """
    return dict(
        per_device_train_batch_size=shape.prompts * shape.generations,
        num_generations=shape.generations,
        max_completion_length=shape.new_tokens,
        beta=beta,
        learning_rate=1e-5,
        max_steps=steps,
        logging_steps=1,
        report_to=[],
        use_cpu=device == "cpu",
        bf16=False,
        gradient_checkpointing=False,
        temperature=1.0,
        multi_objective_aggregation="normalize_then_sum",
        loss_type="grpo",
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def bench_trl(
    ckpt: str, beta: float, *, warmup: int, iters: int, device: str = "cpu", shape: Shape = TINY
) -> dict[str, list[float]]:
    """TRL GRPOTrainer's steady-state iterations: {series name (TIMES): [iters floats]}.

    device: "cpu", or "cuda" where our side runs on a GPU (`common.torch_device`)."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    steps = warmup + iters
    ds = Dataset.from_list(
        [{"prompt": p} for p in prompts(shape.prompts * steps, vocab=shape.vocab)]
    )
    args = GRPOConfig(
        output_dir=common.scratch_dir("bench_trl_"), **trl_args(shape, beta, steps, device)
    )
    trainer = GRPOTrainer(
        model=ckpt,
        reward_funcs=list(REWARDS),
        args=args,
        train_dataset=ds,
        processing_class=AutoTokenizer.from_pretrained(ckpt),
    )
    times: dict[str, list[float]] = {"sample": [], "reward": [], "iter": [], "len": []}

    def wrap(name, key):
        orig = getattr(trainer, name)

        def timed(*a, **k):
            t = time.perf_counter()
            out = orig(*a, **k)
            times[key].append(time.perf_counter() - t)
            return out

        setattr(trainer, name, timed)

    wrap("_generate", "sample")
    wrap("_calculate_rewards", "reward")

    # CUDA kernels run asynchronously: without a wait, the optimizer's last kernels
    # would finish after the clock stops and their time would land outside the step.
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            sync()
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            sync()
            times["iter"].append(time.perf_counter() - self.t)

        def on_log(self, args, state, control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                times["len"].append(logs["completions/mean_length"])

    trainer.add_callback(Clock())
    trainer.train()
    it, sample, reward = (times[k][warmup:] for k in ("iter", "sample", "reward"))
    return {
        "iter_s": it,
        "sample_s": sample,
        "reward_s": reward,
        # TRL's step: the rest of its iteration (loss, backward, optimizer).
        "step_s": [i - s - r for i, s, r in zip(it, sample, reward)],
        "len": times["len"][warmup:] or [float("nan")] * len(it),
    }


def bench_trl_clean_env(
    ckpt: str, beta: float, *, warmup: int, iters: int, device: str = "cpu", model: str = "tiny"
) -> dict[str, Any]:
    """bench_trl in a child process whose environment lacks our malloc tunable.

    gdpo_jax's CLIs and benchmarks run with glibc's huge-page tunable
    (gdpo_jax/hostenv.py); PyTorch's CPU step measured slower with it, so TRL
    runs as a TRL user would run it: a plain environment.
    """
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env["GDPO_JAX_NO_RELAUNCH"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "trl.json")
        args = child_args(ckpt, out, beta, warmup, iters, device, model)
        cmd = [sys.executable, "-m", "benchmarks.rl_trl", *args]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"TRL benchmark process failed:\n{proc.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)


def child_args(
    ckpt: str, out: str, beta: float, warmup: int, iters: int, device: str, model: str
) -> list[str]:
    """The command line of `bench_trl_clean_env`'s child (`main` parses it)."""
    args = [ckpt, out, "--beta", repr(beta), "--warmup", str(warmup), "--iters", str(iters)]
    return args + ["--device", device, "--model", model]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("out")
    ap.add_argument("--beta", type=float, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--iters", type=int, required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", choices=sorted(SHAPES), default="tiny")
    return ap


def main() -> None:
    """The child of `bench_trl_clean_env`: one bench_trl run, written as JSON."""
    a = parser().parse_args()
    res = bench_trl(
        a.ckpt, a.beta, warmup=a.warmup, iters=a.iters, device=a.device, shape=SHAPES[a.model]
    )
    with open(a.out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
