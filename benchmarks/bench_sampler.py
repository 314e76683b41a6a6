"""Benchmark: generated tokens/s of gdpo_jax's Sampler vs transformers generate().

One tiny random Llama checkpoint (hidden 256, 4 layers, 4 heads / 2 kv heads,
vocab 2048) is written with transformers to a temp dir and loaded by both
sides (ours through gdpo_jax.models.load_pretrained). Batch: 8 prompts of 24
tokens x G = 8 generations = 64 rows; every row generates exactly
max_new_tokens (EOS off on our side, min_new_tokens on transformers' side).
Greedy, sampled (temperature 1, no top-k/top-p) and top-k 50 (transformers'
default sampling filter), all timed in the same rounds on the same cores (every
mode of both sides per round; each turn two calls, the second timed, as the first
after the other framework's calls re-warms the process); transformers
(PyTorch CPU) runs at its default thread count and single-threaded, and the
faster counts (on an oversubscribed machine OpenMP spin-waiting can make the
default 30x slower). Ours is timed end to end
(token-id prompts in, NumPy Rollouts with log-probs out), after one compiling
call whose time is reported apart. Greedy rows are also checked against
transformers' tokens (same checkpoint, same maths).

On a GPU backend transformers runs on CUDA too (when torch sees a GPU), and the
thread counts do not apply. ``--model smollm2`` swaps in SmolLM2-135M's shapes
(random init; 4 prompts of 100 tokens x 4 generations, 64 new tokens): the
size the smollm2 configs train, where the unembedding (vocab 49152) is a large
part of each decode step.

  python -m benchmarks.bench_sampler [--quick] [--model tiny|smollm2] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import jax
import numpy as np

from benchmarks import common
from benchmarks.bench_model import SMOLLM2_135M

DEFAULT_OUT = "runs/bench/sampler.json"
HF_CONFIG = dict(
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
)
# SmolLM2-135M's architecture (bench_model's config), random init; pad 0 as the tiny one's.
SMOLLM2_HF_CONFIG = {**SMOLLM2_135M.to_hf(), "pad_token_id": 0}
# Decoding modes: name -> top-k (0 = off). Temperature 1 and top-p 1 throughout.
MODES = {"greedy": 0, "sampled": 0, "top-k 50": 50}

# model name -> (HF config, prompts, generations per prompt, prompt tokens, new tokens)
MODELS = {
    "tiny": (HF_CONFIG, 8, 8, 24, 128),
    "smollm2": (SMOLLM2_HF_CONFIG, 4, 4, 100, 64),
}
PROMPT_LEN = MODELS["tiny"][3]  # bench_longtail's prompts


def _write_checkpoint(out_dir: str, hf_config: dict = HF_CONFIG) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**hf_config)).eval()
    hf.save_pretrained(out_dir)
    return hf


def run(quick: bool = False, model_name: str = "tiny") -> dict:
    """Returns a JSON-able dict (used by benchmarks/run_all.py)."""
    import torch

    from gdpo_jax.models import load_pretrained
    from gdpo_jax.sampling import Sampler, SamplingParams

    hf_config, num_prompts, group, prompt_len, max_new = MODELS[model_name]
    max_new = max_new // 2 if quick else max_new
    repeats = 3 if quick else 5
    rows = num_prompts * group
    rng = np.random.default_rng(0)
    prompts = rng.integers(6, hf_config["vocab_size"], (num_prompts, prompt_len)).astype(np.int32)
    with tempfile.TemporaryDirectory() as tmp:
        hf = _write_checkpoint(tmp, hf_config)
        model, _ = load_pretrained(tmp)
    sampler = Sampler(model, None, eos_token_ids=())  # EOS off: every row runs max_new
    hf_device = common.torch_device()
    hf = hf.to(hf_device)
    hf_ids = torch.as_tensor(np.repeat(prompts, group, axis=0), dtype=torch.long, device=hf_device)

    greedy_tokens, compile_s, fns = {}, {}, []
    default_threads = torch.get_num_threads()
    # transformers at its default thread count and single-threaded (OpenMP spin-waits
    # collapse on an oversubscribed machine); the faster one counts. On CUDA the host
    # threads do not matter: default only.
    hf_threads = [default_threads] + ([1] if hf_device == "cpu" else [])
    for mode in MODES:
        params = SamplingParams(max_new_tokens=max_new, greedy=mode == "greedy", top_k=MODES[mode])
        calls = iter(range(10**6))

        # This iteration's mode / params / calls are bound as defaults (the closures
        # are called after the loop).
        def ours(mode: str = mode, params: SamplingParams = params, calls=calls) -> None:
            ro = sampler.generate(
                [list(p) for p in prompts],
                params,
                num_generations=group,
                key=jax.random.key(next(calls)),
            )
            assert int(ro.lengths.sum()) == rows * max_new
            greedy_tokens.setdefault(mode, ro.completion_ids)

        def theirs(threads: int, mode: str = mode) -> None:
            torch.set_num_threads(threads)
            with torch.no_grad():
                out = hf.generate(
                    hf_ids,
                    attention_mask=torch.ones_like(hf_ids),
                    max_new_tokens=max_new,
                    min_new_tokens=max_new,
                    do_sample=mode != "greedy",
                    temperature=1.0,
                    top_k=MODES[mode],
                    top_p=1.0,
                    pad_token_id=0,
                )
            out = out.cpu()  # on CUDA this waits for the generation to finish
            assert out.shape == (rows, prompt_len + max_new)
            greedy_tokens.setdefault("hf_" + mode, out[:, prompt_len:].numpy())

        t0 = time.perf_counter()
        ours()  # compiles
        compile_s[mode] = time.perf_counter() - t0
        fns += [ours] + [lambda n=n, theirs=theirs: theirs(n) for n in hf_threads]
    # Every mode of both sides in the same rounds (timed one mode after another, greedy,
    # timed first, ran on a colder process than the others). Each turn calls its function
    # twice and times the second call: the first call after the other framework's pays
    # for re-warming the process (our SmolLM2-shape decode about 1-2 s more), which
    # neither framework's own user pays; those first calls are reported apart.
    times = common.time_interleaved(fns, repeats=repeats, calls_per_turn=2)
    torch.set_num_threads(default_threads)
    results, per_mode = [], 1 + len(hf_threads)
    for i, mode in enumerate(MODES):
        t_ours, t_hf_n, *t_hf_1 = times[i * per_mode : (i + 1) * per_mode]
        t_hf_1 = t_hf_1[0] if t_hf_1 else None
        t_hf = min([t_hf_n] + ([t_hf_1] if t_hf_1 else []), key=lambda t: t["best_s"])
        tokens = rows * max_new
        results.append(
            {
                "mode": mode,
                "rows": rows,
                "new_tokens": max_new,
                "ours_tokens_per_s": round(tokens / t_ours["best_s"], 1),
                "hf_tokens_per_s": round(tokens / t_hf["best_s"], 1),
                "speedup": round(t_hf["best_s"] / t_ours["best_s"], 2),
                "ours_s": round(t_ours["best_s"], 3),
                "hf_s": round(t_hf["best_s"], 3),
                "hf_threads": default_threads if t_hf is t_hf_n else 1,
                "hf_default_threads_s": round(t_hf_n["best_s"], 3),
                "hf_1_thread_s": round(t_hf_1["best_s"], 3) if t_hf_1 else None,
                "ours_median_s": round(t_ours["median_s"], 3),
                "hf_median_s": round(t_hf["median_s"], 3),
                # Best first call of a turn, right after the other framework's calls.
                "ours_first_s": round(t_ours["first_best_s"], 3),
                "hf_first_s": round(t_hf["first_best_s"], 3),
                "ours_compile_s": round(compile_s[mode], 2),
            }
        )
    # Same checkpoint, same maths: greedy rows should agree (HF bans EOS via
    # min_new_tokens, so a row may diverge where EOS would be the argmax).
    same = np.mean(np.all(greedy_tokens["greedy"] == greedy_tokens["hf_greedy"], axis=1))
    return {
        "benchmark": "sampler",
        "quick": quick,
        "machine": common.machine_info(),
        "torch_threads": default_threads,
        "hf_device": hf_device,
        # On a GPU JAX's default f32 matmuls are TF32, torch's are full f32.
        "matmul_precision": str(jax.config.jax_default_matmul_precision or "default"),
        "model_name": model_name,
        "model": hf_config,
        "prompts": num_prompts,
        "group": group,
        "prompt_len": prompt_len,
        "repeats": repeats,
        # How the modes were timed: every mode of both sides in each round, each turn
        # two calls, the second timed (before 2026-12-05: one mode after another, one
        # call a turn).
        "timing": "rounds, 2 calls a turn, the second timed",
        "greedy_rows_identical_to_hf": float(same),
        "results": results,
    }


def format_table(result: dict) -> str:
    # Runs before 2026-12-05 made one call a turn: no first-call columns.
    turns = "ours_first_s" in result["results"][0]
    torch_on = (
        "torch on CUDA"
        if result.get("hf_device") == "cuda"
        else f"torch {result['torch_threads']} or 1 thread, the faster"
    )
    head = (
        f"Sampler vs transformers generate() ({result.get('model_name', 'tiny')} model; "
        f"{result['machine'].get('backend')}; {torch_on}); {result['prompts']} prompts x G "
        f"{result['group']}, prompt {result['prompt_len']}; best of {result['repeats']}"
        f"{' (second call of each turn; first_s: the first)' if turns else ''}; "
        f"greedy rows identical to HF: {result['greedy_rows_identical_to_hf']:.0%}"
    )
    cols = [
        "mode",
        "rows",
        "new_tokens",
        "ours_tokens_per_s",
        "hf_tokens_per_s",
        "speedup",
        "ours_s",
        "hf_default_threads_s",
        "hf_1_thread_s",
        *(["ours_first_s", "hf_first_s"] if turns else []),
        "ours_compile_s",
    ]
    return head + "\n" + common.text_table(result["results"], cols)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON output path.")
    parser.add_argument("--quick", action="store_true", help="Fewer new tokens and repeats.")
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny", help="Model shapes.")
    args = parser.parse_args()
    common.check_out(parser, args.out, "--out", is_dir=False)  # before the run
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = run(quick=args.quick, model_name=args.model)
    print(format_table(result))
    print(f"wrote {common.write_json(args.out, result)}")


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
