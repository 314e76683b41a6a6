"""Batched G-fold generation on the policy's own weights: ``Sampler.generate``.

    sampler = Sampler(model, tokenizer, mesh=mesh)
    ro = sampler.generate(prompts, SamplingParams(max_new_tokens=256, temperature=1.0),
                          num_generations=8, key=jax.random.key(0))
    ro.completion_ids  # i32[len(prompts) * 8, 256]; row r answers prompt r // 8

Host side: tokenize (chat template for message lists), left pad the distinct
prompts to a length bucket, map each of the rows to its prompt (G per prompt),
pad the rows to a multiple of the mesh's batch shards; device side: one
compiled program, a prefill of the distinct prompts + ``while_loop`` decode
(`decode.py`); host side again: stop strings, decoding, :class:`Rollouts`.

Log-probs are those of the tempered distribution *before* top-k / top-p,
``log_softmax(logits / T)[token]`` (TRL / verl "old log-probs" convention).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from gdpo_jax import sharding as mesh_lib
from gdpo_jax.sampling import decode, hostio
from gdpo_jax.sampling.encoding import encode_prompts
from gdpo_jax.sampling.params import (
    DEFAULT_BUCKETS,
    FINISH_NAMES,
    Rollouts,
    SamplingParams,
    bucket_length,
    default_prompt_buckets,
)
from gdpo_jax.sampling.prompt_slots import prompt_slots_used
from gdpo_jax.sampling.stopping import apply_stop_strings, stop_sequences

__all__ = [
    "DEFAULT_BUCKETS",
    "FINISH_NAMES",
    "Rollouts",
    "Sampler",
    "SamplingParams",
    "bucket_length",
    "default_prompt_buckets",
]


class Sampler:
    """Generates G completions per prompt with the model's current weights.

    Args:
      model: a gdpo_jax Transformer (possibly sharded); read at every call.
      tokenizer: a Hugging Face tokenizer (None only for token-id prompts with no
        stop strings; texts are then empty).
      mesh: shard rows over its ("data", "fsdp") axes; None = single device.
      prompt_buckets: allowed prompt widths (fewer widths = fewer compilations).
      eos_token_ids: override; default = model cfg EOS ids + tokenizer.eos_token_id.
      decode_chunks: decode phases with a growing KV cache (see decode.py);
        None = one per 32 new tokens, at most 4.
      decode_layers: how the decode loop runs the layers (``DecodeSpec.layers``):
        "scan", "unrolled", "fused", or "auto" (`decode.decode_layers_default`:
        fused on CPU in f32 on one device, unrolled on CPU in f32 under a mesh,
        fused on one GPU in bf16 / f16, else the scan). Same tokens either way.
      decode_growth: how the decode's phases get their slots
        (``DecodeSpec.growth``): "prefix" (one cache, phases read a prefix of
        it), "copy" (a longer cache per phase), or "auto"
        (`decode.decode_growth_default`: copy for the unrolled forms on CPU,
        else prefix). Same tokens either way.
      continuous_slots: > 0: continuous batching with this many decode slots
        per batch shard (`continuous.py`: a finished row's slot takes the next
        waiting row of its shard). 0 = static batch (every row decodes until
        the call's longest row ends).
      share_prompt_cache: keep each prompt's KV cache once for its G rows
        (``DecodeSpec.group``) instead of a copy per row, when every prompt
        has its G rows and there are no batch-padding rows (else copies).
        Same tokens; prompt KV memory and reads drop G-fold. With
        continuous_slots it shares nothing by itself: it allows
        continuous_prompt_slots (0 = a prompt copy per lane).
      continuous_prompt_slots: > 0 (with continuous_slots, share_prompt_cache
        and G > 1): continuous batching's lanes read their prompts from this
        many shared prompt slots per batch shard instead of a copy per lane
        (`continuous.py`, "Shared prompt slots"); same tokens. 0 = copies.
    """

    def __init__(
        self,
        model: nnx.Module,
        tokenizer: Any = None,
        *,
        mesh: jax.sharding.Mesh | None = None,
        prompt_buckets: Sequence[int] = DEFAULT_BUCKETS,
        eos_token_ids: Sequence[int] | None = None,
        decode_chunks: int | None = None,
        continuous_slots: int = 0,
        decode_layers: str = "auto",
        share_prompt_cache: bool = True,
        continuous_prompt_slots: int = 0,
        decode_growth: str = "auto",
    ):
        if not prompt_buckets or any(int(b) < 1 for b in prompt_buckets):
            raise ValueError(f"prompt_buckets={prompt_buckets!r} must be positive lengths.")
        self.model = model
        self.tokenizer = tokenizer
        self.mesh = mesh
        self.prompt_buckets = tuple(sorted(int(b) for b in prompt_buckets))
        cfg = model.cfg
        if eos_token_ids is None:
            ids = set(cfg.eos_token_ids)
            if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
                ids.add(int(tokenizer.eos_token_id))
            eos_token_ids = sorted(ids)
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        for cand in (pad, cfg.pad_token_id, *self.eos_token_ids, 0):
            if cand is not None:
                self.pad_id = int(cand)
                break
        if decode_chunks is not None and int(decode_chunks) < 1:
            raise ValueError(f"decode_chunks={decode_chunks} must be >= 1 (or None for auto).")
        self.decode_chunks = decode_chunks
        if decode_layers not in ("auto", *decode.DECODE_LAYERS):
            raise ValueError(
                f"decode_layers={decode_layers!r}: use 'auto' or one of {decode.DECODE_LAYERS}."
            )
        one_device = mesh is None or mesh.devices.size == 1
        if continuous_slots < 0:
            raise ValueError(
                f"continuous_slots={continuous_slots}: use >= 1 decode slots per batch "
                "shard for continuous batching, or 0 for static calls."
            )
        self.continuous_slots = int(continuous_slots)
        if continuous_prompt_slots < 0:
            raise ValueError(
                f"continuous_prompt_slots={continuous_prompt_slots}: use >= 1 shared prompt "
                "slots per batch shard, or 0 for a prompt copy per lane."
            )
        self.continuous_prompt_slots = int(continuous_prompt_slots)
        self._one_device = None
        if self.continuous_slots and one_device:
            # One device: the plain (unsharded) call path; weights typed on a
            # 1-device (Explicit) mesh are re-placed as plain device arrays.
            self._one_device = None if mesh is None else mesh.devices.flat[0]
            self.mesh = None
        if decode_layers == "auto":
            decode_layers = decode.decode_layers_default(model.cfg.dtype, one_device)
        self.decode_layers = decode_layers
        if decode_growth not in ("auto", *decode.DECODE_GROWTH):
            raise ValueError(
                f"decode_growth={decode_growth!r}: use 'auto' or one of {decode.DECODE_GROWTH}."
            )
        if decode_growth == "auto":
            decode_growth = decode.decode_growth_default(decode_layers)
        self.decode_growth = decode_growth
        self.share_prompt_cache = bool(share_prompt_cache)
        self._fns: dict[tuple, Any] = {}
        self.num_traces = 0  # jit traces so far (a compile-once check for tests)

    # ----------------------------------------------------------------- prompts
    def encode_prompts(self, prompts: Sequence[Any], chat_template: bool = True) -> list[list[int]]:
        """str -> tokenizer(str); message list -> chat template with the generation
        prompt; a sequence of ints -> used as is (`encoding.encode_prompts`)."""
        return encode_prompts(
            self.tokenizer, self.model.cfg.vocab_size, prompts, chat_template=chat_template
        )

    # ---------------------------------------------------------------- generate
    def generate(
        self,
        prompts: Sequence[Any],
        params: SamplingParams,
        *,
        num_generations: int = 1,
        key: jax.Array,
        chat_template: bool = True,
        max_new_tokens_per_row: Sequence[int] | None = None,
        first_row: int | None = None,
    ) -> Rollouts:
        """Samples ``num_generations`` completions for every prompt (rows grouped:
        row r answers prompt r // G). Deterministic given key (and the mesh-
        independent threefry, so sharded == unsharded).

        Several processes (``jax.distributed``, a mesh over all of them): a
        collective; every process calls it with its *own* prompts (any number,
        0 included) and gets back only its own rows. The global batch is the
        processes' blocks in mesh order, and a row's randomness depends on its
        id (`filters.row_keys`; the real rows of the blocks before it, plus its
        index), so the rollouts equal a one-process run over the
        concatenated prompts when every process passes the same count.
        ``info["row_offset"]`` / ``info["prompt_offset"]``: where this process's
        rows / prompts sit in the global batch.
        max_new_tokens_per_row: optional budget of each of the len(prompts) * G
        rows (<= params.max_new_tokens); a row reaching it finishes "length"
        (e.g. to benchmark a given length distribution).
        first_row: the id of this process's first row in this call; its row j has
        id first_row + j, and a row's random stream is its id's
        (``filters.row_keys``). Default: the rows the processes before this one
        pass (mesh block order; 0 in one process), so a call equals one over the
        processes' concatenated prompts. Calls over chunks of a larger batch, each
        process passing the place of its rows there (the trainer's
        ``sampling.rows_per_call``), sample what one call over the whole batch does,
        whatever the chunking, the process count or the batch padding.
        """
        g = int(num_generations)
        if g < 1:
            raise ValueError(f"num_generations={num_generations} must be >= 1.")
        if params.stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer (Sampler(tokenizer=...)).")
        t0 = time.perf_counter()
        axes = mesh_lib.batch_axes(self.mesh)
        # Several processes (mesh given): agree on prompt count and width; this
        # process's rows are its block of the global batch (see hostio.py).
        multi = self.mesh is not None and jax.process_count() > 1
        block, nblocks = hostio.row_block(self.mesh, axes) if multi else (0, 1)
        error = None
        try:
            encoded = self.encode_prompts(prompts, chat_template) if len(prompts) else []
        except (TypeError, ValueError) as e:
            if not multi:
                raise
            # Raised here alone, it left the other processes waiting in the gather
            # below until the distributed runtime aborted them all: every one raises.
            error, encoded = e, []
        width = max((len(e) for e in encoded), default=0)
        facts = np.array([block, len(encoded), width, error is not None], np.int64)
        facts = hostio.allgather(facts) if multi else facts[None]
        if error is not None:
            raise error
        if facts[:, 3].any():
            raise ValueError(
                "a prompt failed to encode on another process (its error names it): "
                f"process blocks {sorted(int(b) for b in facts[facts[:, 3] > 0, 0])}."
            )
        if not facts[:, 1].any():
            raise ValueError(
                "prompts is empty." if not multi else "prompts is empty on every process."
            )
        u_max, n = int(facts[:, 1].max()), len(encoded) * g
        plen = bucket_length(int(facts[:, 2].max()), self.prompt_buckets)
        local_shards = mesh_lib.batch_axis_size(self.mesh) // nblocks
        # At least 2 rows in all on an explicit-axes mesh: JAX cannot resolve the sharding
        # of the token-choice gather over a batch of one row (a 1-row eval call failed).
        least = max(local_shards, -(-2 // nblocks) if mesh_lib.is_explicit(self.mesh) else 1)
        n_local_pad = max(-(-(u_max * g) // local_shards) * local_shards, least)
        # Absent prompts (a process with fewer) are one pad token: prefilled, read only
        # by inactive batch-padding rows, whose tokens are never used.
        ids = np.full((u_max, plen), self.pad_id, np.int32)
        mask = np.zeros((u_max, plen), np.int32)
        mask[:, -1] = 1
        for i, e in enumerate(encoded):
            ids[i, plen - len(e) :] = e
            mask[i, :] = 0
            mask[i, plen - len(e) :] = 1
        if multi:  # every process learns every prompt, in block order
            order = np.argsort(facts[:, 0])
            all_ids, all_mask = hostio.allgather(ids)[order], hostio.allgather(mask)[order]
            ids_g, mask_g = all_ids.reshape(-1, plen), all_mask.reshape(-1, plen)
        else:
            ids_g, mask_g = ids, mask
        # Row r answers prompt r // G; batch-padding rows copy the last prompt.
        local_row = np.minimum(np.arange(n_local_pad), max(n - 1, 0)) // g
        row_prompt = (block * u_max + local_row).astype(np.int32)
        active = np.arange(n_local_pad) < n
        if first_row is None:  # the real rows of the blocks before this one
            first_row = int(facts[facts[:, 0] < block, 1].sum()) * g
        row_ids = (first_row + np.arange(n_local_pad)).astype(np.int32)  # padding rows too

        share = self.share_prompt_cache and not self.continuous_slots
        group = decode.shared_prompt_group(share, n_local_pad, u_max, g)
        fn = self._get_fn(params, group=group, rows_per_prompt=g)
        state = nnx.state(self.model)
        if self._one_device is not None:
            state = jax.device_put(state, jax.sharding.SingleDeviceSharding(self._one_device))
        args = (
            ids_g,
            mask_g,
            row_prompt,
            active,
            key,
            np.float32(params.temperature),
            np.float32(params.top_p),
            np.asarray(self.eos_token_ids, np.int32).reshape(-1),
            np.asarray(params.stop_token_ids, np.int32).reshape(-1),
            self._stop_sequences(params.stop_strings),
            self._row_limit(max_new_tokens_per_row, n, n_local_pad, params.max_new_tokens),
            row_ids,
        )
        traces = self.num_traces
        lo = block * n_local_pad
        t1 = time.perf_counter()
        if self.mesh is None:
            out = jax.device_get(fn(state, *args))
            out = {k: np.asarray(v) for k, v in out.items()}
        else:
            args = tuple(
                hostio.to_global_rows(a, self.mesh, axes, nblocks)
                if i in (2, 3, 10, 11)  # row_prompt, active, row_limit, row_ids
                else hostio.replicate_key(a, self.mesh)
                if i == 4
                else hostio.to_global_replicated(a, self.mesh)
                for i, a in enumerate(args)
            )
            with jax.set_mesh(self.mesh):
                res = fn(state, *args)
            # Only this process's rows come back (no cross-host transfer); the
            # counters (steps, and continuous batching's row / lane steps) are scalars.
            out = {
                k: hostio.local_rows(v, lo, lo + n) if v.ndim else hostio.scalar(v)
                for k, v in res.items()
            }
        t_dev = time.perf_counter() - t1  # compile (first call) + prefill + decode + transfer

        tokens = np.array(out["tokens"][:n], np.int32)  # writable copies
        logprobs = np.array(out["logprobs"][:n], np.float32)
        lengths = np.array(out["lengths"][:n], np.int32)
        finish = [FINISH_NAMES[int(c)] for c in out["finish"][:n]]
        if self.tokenizer is not None:
            texts = [
                self.tokenizer.decode(tokens[r, : lengths[r]].tolist(), skip_special_tokens=True)
                for r in range(n)
            ]
        else:
            texts = [""] * n
        if params.stop_strings:
            apply_stop_strings(self.tokenizer, params.stop_strings, tokens, lengths, finish, texts)
        cmask = (np.arange(tokens.shape[1])[None, :] < lengths[:, None]).astype(np.int32)
        tokens = np.where(cmask > 0, tokens, self.pad_id).astype(np.int32)
        logprobs = np.where(cmask > 0, logprobs, 0.0).astype(np.float32)
        group = (np.arange(n) // g).astype(np.int32)
        info = dict(
            seconds=time.perf_counter() - t0,
            device_seconds=t_dev,
            prompt_bucket=plen,
            decode_steps=int(out["steps"]),
            batch_rows=n_local_pad * nblocks,
            generated_tokens=int(lengths.sum()),
            # Row-steps the decode computed (useful or not): steps x decode rows.
            decoded_tokens=int(out.get("lane_steps", int(out["steps"]) * n_local_pad * nblocks)),
            compiled=self.num_traces > traces,
            row_offset=lo,
            prompt_offset=block * u_max,
        )
        u = len(encoded)
        return Rollouts(
            prompt_ids=np.repeat(ids[:u], g, axis=0),
            prompt_mask=np.repeat(mask[:u], g, axis=0),
            completion_ids=tokens,
            completion_mask=cmask,
            logprobs=logprobs,
            lengths=lengths,
            finish_reason=finish,
            group_ids=group,
            prompt_index=group.copy(),
            texts=texts,
            info=info,
        )

    # ------------------------------------------------------------- internals
    def _get_fn(self, params: SamplingParams, group: int = 0, rows_per_prompt: int = 1):
        m = int(params.max_new_tokens)
        spec = decode.DecodeSpec(
            max_new_tokens=m,
            chunks=decode.decode_chunks(m, self.decode_chunks),
            top_k=int(params.top_k),
            use_top_p=params.top_p < 1.0,
            greedy=bool(params.greedy),
            pad_id=self.pad_id,
            layers=self.decode_layers,
            group=group,
            growth=self.decode_growth,
        )
        graphdef = nnx.graphdef(self.model)
        # Continuous batching: G bounds a shard's prompts (mesh) and, with shared
        # prompt slots (W), places rows in them; key (graphdef, spec, (slots, G, W)).
        w = self.continuous_prompt_slots
        w = prompt_slots_used(w, self.share_prompt_cache, rows_per_prompt)
        cont = (self.continuous_slots, int(rows_per_prompt), w) if self.continuous_slots else 0
        cache_key = (graphdef, spec, cont)
        if cache_key not in self._fns and self.continuous_slots:
            from gdpo_jax.sampling.continuous import make_continuous_generate_fn

            self._fns[cache_key] = make_continuous_generate_fn(
                graphdef,
                spec,
                self.continuous_slots,
                self._on_trace,
                mesh=self.mesh,
                rows_per_prompt=rows_per_prompt,
                prompt_slots=w,
            )
        if cache_key not in self._fns:
            self._fns[cache_key] = decode.make_generate_fn(
                graphdef, spec, self.mesh, self._on_trace
            )
        return self._fns[cache_key]

    @staticmethod
    def _row_limit(limits: Sequence[int] | None, n: int, rows: int, m: int) -> np.ndarray:
        """i32[rows]: each row's token budget (padding rows and default: m)."""
        out = np.full((rows,), m, np.int32)
        if limits is not None:
            lim = np.asarray(limits, np.int64).reshape(-1)
            if lim.shape[0] != n or (lim < 1).any() or (lim > m).any():
                raise ValueError(
                    f"max_new_tokens_per_row needs {n} values in [1, max_new_tokens={m}]; "
                    f"got {lim.shape[0]} in [{lim.min(initial=0)}, {lim.max(initial=0)}]."
                )
            out[:n] = lim
        return out

    def _on_trace(self) -> None:
        self.num_traces += 1

    def _stop_sequences(self, stop_strings: Sequence[str]) -> np.ndarray:
        """i32[S, L] right-aligned stop-string token sequences (`stopping.stop_sequences`)."""
        return stop_sequences(self.tokenizer, stop_strings)
